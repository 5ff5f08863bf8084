//go:build !linux

package index

import "time"

func processUsage() (cpu time.Duration, faults int64, ok bool) { return 0, 0, false }
