//go:build race

package regional

const raceEnabled = true
