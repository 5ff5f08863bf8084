//go:build linux

package index

import (
	"syscall"
	"time"
)

// processUsage returns the CPU time this process has used, every thread
// counted (user and system), and its minor page faults so far.
func processUsage() (cpu time.Duration, faults int64, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Minflt, true
}
