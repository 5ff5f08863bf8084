//go:build !unix

package regional

import "time"

// canReadCPUTime: the adaptive GOMAXPROCS needs the process's CPU time,
// which is not read here; the runtime's default stays.
const canReadCPUTime = false

func processCPUTime() time.Duration { return 0 }
