package main

import (
	"bytes"
	"fmt"

	"github.com/quotad/quotad/rpc"
)

// readAdminToken returns the token in the file at path, surrounding
// whitespace (a trailing newline) removed. An empty path means no token.
func readAdminToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	raw, err := readFile(path)
	if err != nil {
		return "", fmt.Errorf("admin token file: %w", err)
	}
	tok := bytes.TrimSpace(raw)
	if len(tok) == 0 {
		return "", fmt.Errorf("admin token file %s: empty (make a token with: openssl rand -base64 32)", path)
	}
	return string(tok), nil
}

// validateAdminToken checks that the file at path, if any, holds a token
// rpc accepts.
func validateAdminToken(path string) error {
	tok, err := readAdminToken(path)
	if err != nil {
		return err
	}
	return rpc.Config{AdminToken: tok}.Validate()
}
