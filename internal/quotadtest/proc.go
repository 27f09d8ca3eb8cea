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
