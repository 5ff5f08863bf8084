package kvevents

// keyTable maps a Rekeyer's keys (rank, group, engine hash) to entry
// numbers. It replaces a Go map, which cost most of a consumer's CPU: a
// pod's map grew from empty by repeated rehashing, and the steady churn of
// stores and removals left deleted slots that lengthened every probe. Here
// the table is sized once from the pod's KV capacity (Rekeyer.Reserve),
// probing is linear over 8-byte slots, and deletion shifts the following
// slots back (no tombstones), so probes stay short however long the pod
// runs.
//
// A slot is 0 (empty) or (fingerprint << 32 | entry+1), where the
// fingerprint is the top 32 bits of the key's hash. The home slot is the
// top bits of the hash, so the fingerprint alone gives any slot's home and
// the table can grow, or shift on deletion, without the keys. The key
// itself lives in the entry and is compared on a fingerprint match.
type keyTable struct {
	slots []uint64
	shift uint // 64 - log2(len(slots))
	n     int
}

// minTableSlots is the smallest table (8 slots, 64 bytes).
const minTableSlots = 8

// keyHash mixes a key into 64 well-spread bits (splitmix64's finalizer):
// engine hashes are usually random already, but not always (a test engine
// or a simple producer may number its blocks).
func keyHash(k ekey) uint64 {
	h := k.hash ^ (uint64(uint32(k.group))<<32|uint64(uint32(k.rank)))*0x9E3779B97F4A7C15
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// reserve makes room for n keys without growing (load at most 3/4).
func (t *keyTable) reserve(n int) {
	size := minTableSlots
	for size*3/4 < n {
		size *= 2
	}
	if size > len(t.slots) {
		t.resize(size)
	}
}

func (t *keyTable) resize(size int) {
	old := t.slots
	t.slots = make([]uint64, size)
	t.shift = 64 - uint(log2(size))
	mask := uint64(size - 1)
	for _, s := range old {
		if s == 0 {
			continue
		}
		i := t.home(uint32(s >> 32))
		for t.slots[i] != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
}

func log2(n int) int {
	b := 0
	for 1<<b < n {
		b++
	}
	return b
}

// home is the home slot of a fingerprint (the top bits of the hash).
func (t *keyTable) home(fp uint32) uint64 {
	return (uint64(fp) << 32) >> t.shift
}

// lookup returns the entry of k, or none. entries holds the keys.
func (t *keyTable) lookup(k ekey, entries []entry) int32 {
	if t.n == 0 {
		return none
	}
	h := keyHash(k)
	fp := uint32(h >> 32)
	mask := uint64(len(t.slots) - 1)
	for i := h >> t.shift; ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return none
		}
		if uint32(s>>32) == fp {
			if e := int32(uint32(s)) - 1; entries[e].key == k {
				return e
			}
		}
	}
}

// insert adds k (which must be absent) for entry e.
func (t *keyTable) insert(k ekey, e int32) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.resize(max(2*len(t.slots), minTableSlots))
	}
	h := keyHash(k)
	mask := uint64(len(t.slots) - 1)
	i := h >> t.shift
	for t.slots[i] != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = h>>32<<32 | uint64(uint32(e+1))
	t.n++
}

// remove deletes k, which must be present as entry e, and shifts the
// slots after it back so that no probe sequence has a hole.
func (t *keyTable) remove(k ekey, e int32) {
	h := keyHash(k)
	mask := uint64(len(t.slots) - 1)
	want := h>>32<<32 | uint64(uint32(e+1))
	i := h >> t.shift
	for t.slots[i] != want {
		i = (i + 1) & mask
	}
	t.n--
	// Backward-shift deletion: move each following slot into the hole
	// unless its home lies cyclically in (hole, slot].
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := t.slots[j]
		if s == 0 {
			break
		}
		home := t.home(uint32(s >> 32))
		if (j-home)&mask >= (j-i)&mask {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = 0
}

// clear empties the table, keeping its size.
func (t *keyTable) clear() {
	clear(t.slots)
	t.n = 0
}
