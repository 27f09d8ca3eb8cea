package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat: USER_HZ, which
// Linux fixes at 100 for user space on every architecture it exports
// /proc to, whatever the kernel's own tick rate.
const userHZ = 100

// procSample is one reading of a process's counters from /proc.
type procSample struct {
	// CPU is user plus system time of every thread, exited ones included.
	// Its resolution is 1/userHZ (10 ms).
	CPU time.Duration
	// Syscalls is read-like plus write-like system calls (syscr + syscw of
	// /proc/<pid>/io): read, write, readv, writev, pread, pwrite and the
	// like, which is how a Go server moves bytes on its sockets. epoll,
	// futex and the scheduler's calls are not in it. -1 when /proc/<pid>/io
	// cannot be read (another user's process).
	Syscalls int64
}

// readProc reads pid's counters; pid 0 means this process.
func readProc(pid int) (procSample, error) {
	name := "self"
	if pid != 0 {
		name = strconv.Itoa(pid)
	}
	stat, err := os.ReadFile("/proc/" + name + "/stat")
	if err != nil {
		return procSample{}, fmt.Errorf("read cpu of pid %s: %w", name, err)
	}
	cpu, err := parseStatCPU(stat)
	if err != nil {
		return procSample{}, fmt.Errorf("/proc/%s/stat: %w", name, err)
	}
	s := procSample{CPU: cpu, Syscalls: -1}
	if io, err := os.ReadFile("/proc/" + name + "/io"); err == nil {
		if n, err := parseIOSyscalls(io); err == nil {
			s.Syscalls = n
		}
	}
	return s, nil
}

// parseStatCPU returns utime+stime from the text of /proc/<pid>/stat. The
// second field, the command name, is in parentheses and may hold spaces
// and parentheses itself, so fields are counted from the last ')'.
func parseStatCPU(stat []byte) (time.Duration, error) {
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, fmt.Errorf("no command name in %q", stat)
	}
	// After ") ": field 3 (state) onwards; utime and stime are fields 14
	// and 15, so indexes 11 and 12 here.
	fields := strings.Fields(string(stat[end+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want at least 13", len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cpu time %q: %w", f, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// parseIOSyscalls returns syscr+syscw from the text of /proc/<pid>/io.
func parseIOSyscalls(text []byte) (int64, error) {
	var n int64
	found := 0
	for line := range strings.Lines(string(text)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "syscr" && k != "syscw") {
			continue
		}
		x, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s %q: %w", k, v, err)
		}
		n += x
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("syscr and syscw not both present")
	}
	return n, nil
}

// loadAverage returns the first three fields of /proc/loadavg, or "" when
// it cannot be read.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
