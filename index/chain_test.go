package index

import "testing"

func TestChainHashesPrefixAndNamespace(t *testing.T) {
	ns := Namespace{Model: "m", BlockSize: 4}
	a := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	b := []uint32{1, 2, 3, 4, 9, 9, 9, 9, 5, 6, 7, 8}
	ha := ChainHashes(ns, a, nil)
	hb := ChainHashes(ns, b, nil)
	if len(ha) != 2 || len(hb) != 3 {
		t.Fatalf("full blocks only: got %d and %d hashes", len(ha), len(hb))
	}
	if ha[0] != hb[0] {
		t.Fatal("equal first blocks must hash equal")
	}
	// Block {5,6,7,8} is the 2nd block of a and the 3rd of b: different prefixes.
	if ha[1] == hb[2] {
		t.Fatal("equal tokens after different prefixes must not collide")
	}
	for _, other := range []Namespace{
		{Model: "m2", BlockSize: 4},
		{Model: "m", LoRA: "l", BlockSize: 4},
		{Model: "m", CacheSalt: "s", BlockSize: 4},
		{Model: "m", BlockSize: 5},
		{Model: "", LoRA: "m", BlockSize: 4},
	} {
		if other.Seed() == ns.Seed() {
			t.Fatalf("namespace %+v has the same seed as %+v", other, ns)
		}
		if ChainHashes(Namespace{Model: other.Model, LoRA: other.LoRA, CacheSalt: other.CacheSalt, BlockSize: 4}, a, nil)[0] == ha[0] && other.BlockSize == 4 {
			t.Fatalf("namespace %+v gives the same first block hash", other)
		}
	}
	// ChainFrom resumes a chain: hashing in two steps equals hashing at once.
	first := ChainHashes(ns, b[:4], nil)
	rest := ChainFrom(first[0], 4, b[4:], nil)
	if rest[0] != hb[1] || rest[1] != hb[2] {
		t.Fatal("ChainFrom does not continue the chain")
	}
}

func TestChainHashesDoesNotAllocate(t *testing.T) {
	ns := Namespace{Model: "m", BlockSize: 16}
	tokens := make([]uint32, 16*64)
	for i := range tokens {
		tokens[i] = uint32(i * 7)
	}
	dst := make([]uint64, 0, 64)
	allocs := testing.AllocsPerRun(100, func() { dst = ChainHashes(ns, tokens, dst[:0]) })
	if allocs != 0 {
		t.Fatalf("ChainHashes allocates %.1f times per call", allocs)
	}
}
