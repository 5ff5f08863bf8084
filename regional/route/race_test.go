//go:build race

package route

// raceEnabled: sync.Pool drops items at random under the race detector, so
// allocation budgets are not checked.
const raceEnabled = true
