package algorithms

import "errors"

// This file is the root of every invalid-input error: ErrInvalidInput, and
// NewInputError, which builds a sentinel that wraps it.

// ErrInvalidInput is what every error about a caller's input wraps: the
// sentinels of this package's Validate and ValidateCost, node's invalid
// policy names, keys, slots and leases, and rpc's malformed requests. Test
// with errors.Is(err, ErrInvalidInput) (node.IsInvalidInput does): a new
// input error built with NewInputError is covered without being listed
// anywhere.
var ErrInvalidInput = errors.New("invalid input")

// NewInputError returns a sentinel error with text: errors.Is holds for it
// and for ErrInvalidInput, and its message is text alone.
func NewInputError(text string) error { return &inputError{text: text} }

// inputError is a sentinel that wraps ErrInvalidInput without saying so in
// its text.
type inputError struct{ text string }

func (e *inputError) Error() string { return e.text }

// Unwrap returns ErrInvalidInput.
func (e *inputError) Unwrap() error { return ErrInvalidInput }
