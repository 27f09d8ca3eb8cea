package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/quotad/quotad/internal/redistest"
)

// pinThreads binds every thread of process pid to cpu. A thread takes its
// creator's binding, so one the process starts meanwhile is caught by the
// second pass.
func pinThreads(pid, cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	for range 2 {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return err
		}
		for _, task := range tasks {
			tid, err := strconv.Atoi(task.Name())
			if err != nil {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("pin thread %d of %d to CPU %d: %w", tid, pid, cpu, err)
			}
		}
	}
	return nil
}

// redisPID is r's process id, from INFO server.
func redisPID(t *testing.T, r *redistest.Server) int {
	t.Helper()
	info, err := r.Do("INFO", "server")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			pid, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("INFO server: process_id %q", v)
			}
			return pid
		}
	}
	t.Fatal("INFO server has no process_id")
	return 0
}
