package envoy

import (
	"errors"

	"github.com/quotad/quotad/algorithms"
)

// This file holds the errors of the package: what Validate, Compile and
// NewService return about a configuration, and what ShouldRateLimit
// returns about a request.

// ErrInvalidConfig is wrapped by every error Config.Validate, Compile and
// NewService return about what they were given.
var ErrInvalidConfig = errors.New("invalid envoy config")

// ErrUnknownDomain is wrapped by the error of a request that names a
// domain the rules do not configure (and that they do not serve anyway,
// DropIn).
var ErrUnknownDomain = errors.New("unknown domain")

// errInvalidRequest: the request is malformed. It wraps node.ErrInvalidInput.
var errInvalidRequest = algorithms.NewInputError("invalid request")
