//go:build !race

package kvevents

const raceEnabled = false
