//go:build !unix

package redistest

import (
	"errors"
	"syscall"
)

// ownSchedGroupAttr: no scheduling group of its own here.
func ownSchedGroupAttr() *syscall.SysProcAttr { return nil }

// raisePriority: not here.
func raisePriority(int) error { return errors.New("no process priorities on this system") }
