package main

import (
	"fmt"
	"os/exec"
	"runtime"
	"syscall"
	"unsafe"
)

// schedIdle is Linux's SCHED_IDLE scheduling policy (sched.h).
const schedIdle = 5

// startSchedIdle starts cmd under SCHED_IDLE: from a thread of its own
// that takes that policy, which a new process inherits from the thread
// that forks it. The thread is never unlocked, so it ends with its
// goroutine and no other goroutine runs at idle priority.
func startSchedIdle(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		var param struct{ priority int32 }
		if _, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETSCHEDULER, 0, schedIdle, uintptr(unsafe.Pointer(&param))); e != 0 {
			errc <- fmt.Errorf("sched_setscheduler SCHED_IDLE: %w", e)
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}
