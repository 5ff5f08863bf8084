// Package index is the block index of one region: for a prompt's chain of
// block hashes it answers, in microseconds and without allocating, which live
// pods hold the longest cached prefix and how long it is.
//
// It imports nothing of ours.
//
// # Chain hashing
//
// A prompt is cut into blocks of BlockSize tokens; only full blocks count.
// H_i = xxhash64(seed = H_{i-1}, little-endian bytes of block i's token ids),
// and H_{-1} = Namespace.Seed(), a hash of (model, LoRA name, cache salt, block
// size). Equal tokens after different prefixes, or under different
// namespaces, get different keys by construction; two distinct chains collide
// only if xxhash64 does (about 2^-64 per pair). 0 is never a key.
package index
