//go:build race

package gossip

// raceEnabled: allocation counts are not meaningful under the race detector.
const raceEnabled = true
