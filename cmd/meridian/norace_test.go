//go:build !race

package main

// raceEnabled: the tests run under the race detector, and so do the
// binaries they build (their packages are then in the build cache).
const raceEnabled = false
