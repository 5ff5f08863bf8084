// Package dr holds Meridian's disaster-recovery tooling in two packages
// with one job each, and no code of its own:
//
//	dr/check   the DR manifest check: can a region's copy of a model
//	           deployment (weights, tokenizer, model, quantisation, engine
//	           and deployment files) serve the model? Reads folders only.
//	dr/drill   failover drills: fail a region over on a running cluster,
//	           time the move and the return, count residency violations.
//
// The two share no code: check reads files and needs nothing of the running
// system; drill talks HTTP to a cluster and needs the admin API client
// (global) and the policy evaluator (residency). Neither imports the other.
// The operator's manual for both, with the meridian dr check, manifest init
// and drill commands, is docs/dr.md at the repository root.
package dr
