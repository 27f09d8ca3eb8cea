package quotadtest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProcStat returns the CPU time (user + system) and resident memory of
// process pid, from /proc (Linux).
func ProcStat(pid int) (cpu time.Duration, rssBytes int64, err error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("process figures come from /proc (Linux): %w", err)
	}
	// Fields after the command name, which may contain spaces, in (…).
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	rssPages, _ := strconv.ParseInt(f[21], 10, 64)
	// Linux reports CPU time in USER_HZ ticks, 100 a second everywhere.
	return time.Duration(utime+stime) * 10 * time.Millisecond, rssPages * int64(os.Getpagesize()), nil
}

// ProcMemory returns the resident memory of process pid now and its peak
// since it started (VmRSS and VmHWM of /proc/pid/status, Linux), in
// bytes. The peak counts what the process touched at any moment, however
// briefly, which sampling ProcStat can miss.
func ProcMemory(pid int) (rssBytes, peakBytes int64, err error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("process figures come from /proc (Linux): %w", err)
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		name, value, ok := strings.Cut(line, ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/status: %s: %w", pid, line, err)
		}
		if name == "VmRSS" {
			rssBytes = kb << 10
		} else {
			peakBytes = kb << 10
		}
	}
	if peakBytes == 0 {
		return 0, 0, fmt.Errorf("/proc/%d/status has no VmHWM: the process has exited", pid)
	}
	return rssBytes, peakBytes, nil
}
