//go:build !race

package demo

// raceEnabled: the tests run under the race detector.
const raceEnabled = false
