// Package dr is Meridian's disaster-recovery tooling. It has two jobs.
//
// The DR manifest check (Check, Init): given a region's copy of a model
// deployment (a Hugging Face style model folder plus engine and deployment
// files) and optionally a DR manifest, say whether that region could serve
// the model, and name every missing, broken or inconsistent file by its
// path as a Finding with a stable Code. The check reads folders only (never
// writes them) and reads no tensor data except to hash; safetensors shards
// cost their header (see dr/safetensors). Every problem with a folder is a
// finding; Check returns an error only when it cannot run.
//
// The failover drill (Drill): fail a region over on a running cluster, time
// how long its traffic takes to move and to come back, and prove no request
// was served outside its residency zone. It talks to the cluster over HTTP
// only: the admin API through global's client, the controllers' public API
// as a client would. Once the trigger was sent the region is recovered
// whatever happens. The judge is a single-threaded state machine fed with
// probe results and call times (no clock of its own), tested with scripts
// in testdata/drill; the probe goroutines and the coordinator loop are the
// outer layer.
//
// The operator's manual (folder layout, manifest format, every check and
// finding code, the drill and the CLI) is docs/dr.md at the repository
// root; a test keeps its table of codes complete.
//
// The package imports only its own sub-packages (dr/safetensors; dr/drtest
// in tests), global (the admin API client and its types) and residency (to
// evaluate the policy in force). It must not import regional, scenarios or
// cmd (a root test enforces it; tests may import anything).
package dr
