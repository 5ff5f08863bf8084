//go:build race

package kvevents

// raceEnabled: allocation counts are not meaningful under the race detector.
const raceEnabled = true
