// Package drill runs failover drills: Run fails a region over on a
// running cluster, times how long its traffic takes to move and to come
// back, and proves no request was served outside its residency zone. It
// returns a Report with the verdict (each Check against its target), the
// timeline and every probe's outcomes. The drill's steps, its verdict and
// its report are described for operators in docs/dr.md at the repository
// root.
//
// Invariants: the drill talks to the cluster over HTTP only: the admin API
// through global's client, the controllers' public API as a client would.
// Once the trigger was sent the region is recovered whatever happens, a
// cancelled context included (admin calls run on their own AdminTimeout); a
// failed recovery returns ErrNotRecovered. Residency violations are judged
// against the policy read at the start. The judge is a single-threaded
// state machine fed with probe results and the call times, with no clock of
// its own, tested with the scripts in testdata; the probe goroutines and the
// coordinator loop are the outer layer, and all of them have returned when
// Run does.
//
// Imports: global (the admin API client and its types) and residency (to
// evaluate the policy in force), nothing else of ours: not regional,
// scenarios or cmd, and not dr/check. The root test deps_test.go enforces
// it; tests may import anything (the fleet tests run a real 3-region
// scenarios/fleet).
package drill
