//go:build unix

package redistest

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ownSchedGroupAttr starts a process in a scheduling group of its own (setsid).
func ownSchedGroupAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

// raisePriority gives process pid nice -10 and, where Linux schedules by
// setsid group (autogroup), that group too.
func raisePriority(pid int) error {
	err := syscall.Setpriority(syscall.PRIO_PROCESS, pid, -10)
	if werr := os.WriteFile(fmt.Sprintf("/proc/%d/autogroup", pid), []byte("-10"), 0); werr != nil && !errors.Is(werr, os.ErrNotExist) {
		err = errors.Join(err, werr)
	}
	return err
}
