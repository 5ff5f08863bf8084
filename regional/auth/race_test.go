//go:build race

package auth_test

// raceEnabled: allocation counts are not meaningful under the race detector.
const raceEnabled = true
