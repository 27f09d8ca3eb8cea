package rpc

import (
	"fmt"
	"net/url"
)

// statusQuery is what a GET /status asks for.
type statusQuery struct {
	// cluster: every member's figures (scope=cluster), not this node's
	// alone (scope=node, the default).
	cluster bool
	// history: the last minutes of samples besides (history=1).
	history bool
}

// parseStatusQuery reads GET /status's parameters; an unknown parameter
// or value is an error that says what is accepted.
func parseStatusQuery(v url.Values) (statusQuery, error) {
	var q statusQuery
	for name, values := range v {
		if len(values) != 1 {
			return q, fmt.Errorf("GET /status: %s is given %d times; give it once", name, len(values))
		}
		value := values[0]
		switch name {
		case "scope":
			switch value {
			case "node", "":
			case "cluster":
				q.cluster = true
			default:
				return q, fmt.Errorf("GET /status: scope=%q: want scope=node (this node's figures, the default) or scope=cluster (every member's, asked now)", value)
			}
		case "history":
			switch value {
			case "1", "true":
				q.history = true
			case "0", "false", "":
			default:
				return q, fmt.Errorf("GET /status: history=%q: want history=1 (add the last minutes of samples) or history=0", value)
			}
		default:
			return q, fmt.Errorf("GET /status: unknown parameter %q: want scope=node|cluster and history=0|1", name)
		}
	}
	return q, nil
}
