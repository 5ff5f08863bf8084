//go:build !race

package regional

const raceEnabled = false
