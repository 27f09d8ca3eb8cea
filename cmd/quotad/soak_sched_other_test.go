//go:build !linux

package main

import (
	"errors"
	"os/exec"
)

// startSchedIdle is Linux's alone (SCHED_IDLE); the soak's figures come
// from /proc too.
func startSchedIdle(cmd *exec.Cmd) error {
	return errors.New("the soak's idle-priority attackers need Linux (SCHED_IDLE)")
}
