//go:build !linux

package kvevents

import "time"

func threadCPU() (time.Duration, bool) { return 0, false }
func lockThread()                      {}
func unlockThread()                    {}
