// Package check is the DR manifest check: given a region's copy of a model
// deployment (a Hugging Face style model folder plus engine and deployment
// files) and optionally a DR manifest, it says whether that region could
// serve the model, and names every missing, broken or inconsistent file by
// its path. Run checks one folder or compares the copies of several
// regions; InitManifest builds the manifest of a healthy folder. The folder
// layout, the manifest format, every check and finding code are described
// for operators in docs/dr.md at the repository root; a test keeps its
// table of codes complete.
//
// Invariants: the check reads folders only (it never writes them) and reads
// no tensor data except to hash it: a safetensors shard costs its header
// (see check/safetensors), and which files are hashed is chosen per run
// (ChecksumMode). Every problem with a folder is a Finding with a stable
// Code and a Severity; Run returns an error only when it cannot run (bad
// config or request, unreadable folder, cancelled context). Findings are
// sorted: blocking first, then by region, path and code. Shard headers and
// hashes are read by Config.Workers goroutines, all of which have returned
// when Run or InitManifest does.
//
// Imports: only its own sub-packages, dr/check/safetensors (and
// dr/check/checktest, which writes healthy test folders, in tests). It needs
// nothing of the running system: not global, residency or index, and not
// dr/drill. The root test deps_test.go enforces it; tests may import
// anything.
package check
