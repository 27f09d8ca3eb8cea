//go:build !unix

package redistest

import (
	"errors"
	"syscall"
)

// ownSessionAttr: no sessions to start here.
func ownSessionAttr() *syscall.SysProcAttr { return nil }

// raisePriority: not here.
func raisePriority(int) error { return errors.New("no process priorities on this system") }
