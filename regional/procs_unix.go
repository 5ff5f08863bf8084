//go:build unix

package regional

import (
	"syscall"
	"time"
)

// canReadCPUTime: processCPUTime works here.
const canReadCPUTime = true

// processCPUTime is the CPU time this process has used, every thread
// counted (user and system).
func processCPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
