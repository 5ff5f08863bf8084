package kvevents

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/index"
)

// naiveRekeyer is the reference for Rekeyer: it keeps every engine block it
// ever accepted, forever, with its own tokens, and after every event
// recomputes from scratch which router blocks the pod holds, by re-hashing
// each block's whole token history from the start of its sequence with
// index.ChainHashes. No windows, no trees, no counters of registrations.
// What it restates of the rules: an engine block is held per tier as a set
// (announced or not); events whose storage is not the pod's own (Local)
// change nothing; the namespace of a sequence is its first block's LoRA and
// salt (from extra keys, else the event's cache_salt); a block with
// multimodal content (extra keys, mm_keys, a string token id) or of a group
// that is not full attention is never registered, nor anything after it.
type naiveRekeyer struct {
	model  string
	R      int
	blocks map[ekey]*naiveBlock
}

type naiveBlock struct {
	key        ekey
	parent     *naiveBlock
	tokens     []uint32
	lora, salt string // of the sequence's first block
	opaque     bool   // this block's own content: not expressible, or not full attention
	held       [index.NumTiers]bool
}

type tierHash struct {
	hash uint64
	tier index.Tier
}

func newNaive(model string, R int) *naiveRekeyer {
	return &naiveRekeyer{model: model, R: R, blocks: map[ekey]*naiveBlock{}}
}

func (n *naiveBlock) alive() bool {
	for _, h := range n.held {
		if h {
			return true
		}
	}
	return false
}

func (n *naiveRekeyer) apply(b *Batch) {
	rank := b.Rank()
	for _, ev := range b.Events {
		n.event(rank, ev)
	}
}

func (n *naiveRekeyer) event(rank int64, ev Event) {
	group := func(g Opt[int64]) int32 {
		if g.Valid {
			return int32(g.V)
		}
		return 0
	}
	switch ev := ev.(type) {
	case *AllBlocksCleared:
		for _, b := range n.blocks {
			if int64(b.key.rank) == rank {
				b.held = [index.NumTiers]bool{}
			}
		}
	case *BlockRemoved:
		t, ok := TierOf(ev.Medium)
		if !ok || !Local(ev.Medium, ev.Locality) {
			return
		}
		for _, h := range ev.BlockHashes {
			if b := n.blocks[ekey{h, group(ev.GroupIdx), int32(rank)}]; b != nil {
				b.held[t] = false
			}
		}
	case *BlockStored:
		t, ok := TierOf(ev.Medium)
		if !ok || !Local(ev.Medium, ev.Locality) || len(ev.BlockHashes) == 0 {
			return
		}
		k := ekey{group: group(ev.GroupIdx), rank: int32(rank)}
		if len(ev.TokenIDs) == 0 {
			for _, h := range ev.BlockHashes {
				k.hash = h
				if b := n.blocks[k]; b != nil && b.alive() {
					b.held[t] = true
				}
			}
			return
		}
		E := int(ev.BlockSize)
		if E <= 0 || len(ev.TokenIDs) != E*len(ev.BlockHashes) || (n.R%E != 0 && E%n.R != 0) {
			return
		}
		var parent *naiveBlock
		if ev.ParentBlockHash.Valid {
			k.hash = ev.ParentBlockHash.V
			parent = n.blocks[k]
			if parent == nil || !parent.alive() || len(parent.tokens) != E {
				return
			}
		}
		lora := ""
		if ev.LoRAName.Valid {
			lora = ev.LoRAName.V
		} else if ev.LoRAID.Valid {
			lora = fmt.Sprintf("lora_id:%d", ev.LoRAID.V)
		}
		for i, h := range ev.BlockHashes {
			k.hash = h
			b := n.blocks[k]
			if b == nil || (!b.alive() && !n.hasLiveDescendant(b)) {
				// New, or forgotten by any implementation that keeps only
				// what it needs: (re)defined by this event.
				var extra Raw
				if i < len(ev.ExtraKeys) {
					extra = ev.ExtraKeys[i]
				}
				salt, opaque := classifyExtra(extra, lora, parent == nil)
				if salt == "" && ev.CacheSalt.Valid {
					salt = ev.CacheSalt.V
				}
				if i < len(ev.MMKeys) {
					if raw := ev.MMKeys[i]; len(raw) > 0 && raw[0] != mpNil && raw[0] != 0x90 && raw[0] != 0x80 {
						opaque = true
					}
				}
				for _, st := range ev.StringTokens {
					if st.Pos >= i*E && st.Pos < (i+1)*E {
						opaque = true
					}
				}
				if k := ev.KVCacheSpecKind; k.Valid && k.V != "full_attention" && k.V != "full" {
					opaque = true
				}
				b = &naiveBlock{key: k, parent: parent, tokens: ev.TokenIDs[i*E : (i+1)*E : (i+1)*E], opaque: opaque}
				if parent == nil {
					b.lora, b.salt = lora, salt
				}
				n.blocks[k] = b
			} else if len(b.tokens) != E {
				return // announced before at another size: the event ends here
			}
			b.held[t] = true
			parent = b
		}
	}
}

func (n *naiveRekeyer) hasLiveDescendant(b *naiveBlock) bool {
	for _, o := range n.blocks {
		for p := o.parent; p != nil; p = p.parent {
			if p == b && o.alive() {
				return true
			}
		}
	}
	return false
}

// held returns, for each (our hash, tier), how many completing engine
// blocks hold it: the multiset the index must hold for the pod.
func (n *naiveRekeyer) held() map[tierHash]int {
	out := map[tierHash]int{}
	for _, b := range n.blocks {
		var chain []*naiveBlock // root first
		for p := b; p != nil; p = p.parent {
			chain = append(chain, p)
		}
		slices.Reverse(chain)
		var toks []uint32
		opaque := false
		for _, p := range chain {
			toks = append(toks, p.tokens...)
			opaque = opaque || p.opaque
		}
		if opaque {
			continue
		}
		root := chain[0]
		ns := index.Namespace{Model: n.model, LoRA: root.lora, CacheSalt: root.salt, BlockSize: n.R}
		ours := index.ChainHashes(ns, toks, nil)
		E := len(b.tokens)
		d := len(chain) - 1 // b covers tokens [d*E, (d+1)*E)
		for j, h := range ours {
			end := (j + 1) * n.R
			if end <= d*E || end > (d+1)*E {
				continue // not completed by b
			}
			for t := index.Tier(0); t < index.NumTiers; t++ {
				all := true
				for i, p := range chain {
					if i*E < end && (i+1)*E > j*n.R && !p.held[t] {
						all = false
					}
				}
				if all {
					out[tierHash{h, t}]++
				}
			}
		}
	}
	return out
}

// opIndex applies Ops to a reference-counted multiset, as the index does,
// and fails on an eviction of something not registered.
type opIndex struct {
	m map[tierHash]int
}

func (x *opIndex) apply(t interface{ Fatalf(string, ...any) }, ops []Op) {
	for _, op := range ops {
		switch op.Kind {
		case OpClearPod:
			clear(x.m)
		case OpRegister:
			for _, h := range op.Hashes {
				x.m[tierHash{h, op.Tier}]++
			}
		case OpEvict:
			for _, h := range op.Hashes {
				k := tierHash{h, op.Tier}
				if x.m[k] == 0 {
					t.Fatalf("evict of %x in %v, which is not registered", h, op.Tier)
				}
				x.m[k]--
				if x.m[k] == 0 {
					delete(x.m, k)
				}
			}
		default:
			t.Fatalf("bad op %+v", op)
		}
	}
}

// engineGen generates event sequences like an engine's, with the hostile
// cases mixed in: engine hashes are a function of (parent hash, tokens,
// rank, group, extra keys), as in vLLM, so one hash always means one block.
type engineGen struct {
	E      int
	maxRun int // most blocks in one BlockStored
	// extraKeys says whether BlockStored events carry extra_keys. vLLM
	// hashes them into the block hash whether or not it publishes them
	// (before vLLM #33304 it did not), so one engine version either always
	// sends them or never does. extraKeysMixed draws it per event instead:
	// one hash then arrives with and without its salt, and only a Rekeyer
	// that never forgets a block can keep its first definition, as the naive
	// reference does (TestRekeyCapRestoreRedefines).
	extraKeys extraKeysMode
	// kinds is the kv_cache_spec_kind of each group's events, drawn once
	// per run (a group's kind is fixed by the model): group 1 may be a
	// sliding-window or mamba group of a hybrid model.
	kinds      [2]Opt[string]
	kindsDrawn bool
	// carrier is how this engine sends a salt and a multimodal item (see
	// event): one engine, one form, unless extraKeys is mixed. carriers,
	// when set, are the ones it may draw from (an engine kind's).
	carrier  int
	carriers []int
	// extraOdds: one store in extraOdds salts its sequence and one puts a
	// multimodal item in it (0: 10). vocab: token ids are drawn from
	// [0, vocab) (0: 3). A fleet lowers both so that pods of different
	// engines store the same salted tokens.
	extraOdds, vocab int
	blocks           []genBlock
}

type extraKeysMode uint8

const (
	extraKeysMixed extraKeysMode = iota
	extraKeysSent
	extraKeysOmitted
)

type genBlock struct {
	hash  uint64
	rank  int64
	group int64
	depth int
}

func (g *engineGen) hash(parent uint64, toks []uint32, rank, group int64, extra string) uint64 {
	f := fnv.New64a()
	var buf []byte
	buf = binary.LittleEndian.AppendUint64(buf, parent)
	for _, t := range toks {
		buf = binary.LittleEndian.AppendUint32(buf, t)
	}
	buf = binary.LittleEndian.AppendUint64(buf, uint64(rank))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(group))
	f.Write(append(buf, extra...))
	return f.Sum64()
}

func (g *engineGen) batch(t *rapid.T) *Batch {
	if !g.kindsDrawn {
		g.kindsDrawn = true
		g.kinds[0] = rapid.SampledFrom([]Opt[string]{{}, Some("full_attention")}).Draw(t, "kind 0")
		g.kinds[1] = rapid.SampledFrom([]Opt[string]{{}, Some("full_attention"), Some("full"), Some("sliding_window"), Some("mamba")}).Draw(t, "kind 1")
		if g.carriers != nil {
			g.carrier = rapid.SampledFrom(g.carriers).Draw(t, "engine carrier")
		} else {
			g.carrier = rapid.IntRange(0, 2).Draw(t, "engine carrier")
		}
	}
	rank := rapid.Int64Range(0, 1).Draw(t, "rank")
	b := &Batch{TS: 1, DataParallelRank: Some(rank)}
	for n := rapid.IntRange(1, 4).Draw(t, "events"); n > 0; n-- {
		b.Events = append(b.Events, g.event(t, rank))
	}
	return b
}

// genStorage is a medium and locality as engines send them: vLLM's and
// SGLang's tiers, vLLM's FS/OBJ/STORAGE with and without locality, SGLang's
// shared external pool, and a medium nobody knows.
type genStorage struct{ medium, locality Opt[string] }

var genStorages = []genStorage{{}, {Some("GPU"), Opt[string]{}}, {Some("CPU"), Opt[string]{}}, {Some("DISK"), Opt[string]{}},
	{Some("gpu"), Opt[string]{}}, {Some("WEIRD"), Opt[string]{}}, {Some("CPU_PINNED"), Opt[string]{}},
	{Some("FS"), Some("LOCAL")}, {Some("FS"), Opt[string]{}}, {Some("OBJ"), Opt[string]{}}, {Some("STORAGE"), Some("LOCAL")},
	{Some("STORAGE"), Some("REMOTE")}, {Some("GPU"), Some("LOCAL")}, {Some("EXTERNAL"), Opt[string]{}}, {Some("EXTERNAL"), Some("LOCAL")}}

func (g *engineGen) event(t *rapid.T, rank int64) Event {
	st := rapid.SampledFrom(genStorages).Draw(t, "storage")
	medium := st.medium
	group := rapid.Int64Range(0, 1).Draw(t, "group")
	known := func(label string) (genBlock, bool) {
		var mine []genBlock
		for _, b := range g.blocks {
			if b.rank == rank {
				mine = append(mine, b)
			}
		}
		if len(mine) == 0 {
			return genBlock{}, false
		}
		return rapid.SampledFrom(mine).Draw(t, label), true
	}
	switch rapid.IntRange(0, 9).Draw(t, "op") {
	case 0, 1, 2, 3: // store new blocks (or re-store: same content gives the same hashes)
		ev := &BlockStored{BlockSize: int64(g.E), Medium: medium, Locality: st.locality}
		var parent uint64
		depth := 0
		if p, ok := known("parent"); ok && rapid.IntRange(0, 3).Draw(t, "root?") > 0 {
			parent, depth, group = p.hash, p.depth+1, p.group
			ev.ParentBlockHash = Some(parent)
		}
		if rapid.IntRange(0, 5).Draw(t, "lora?") == 0 {
			ev.LoRAName = Some("l1")
		}
		extraKind := rapid.IntRange(0, cmp.Or(g.extraOdds, 10)-1).Draw(t, "extra")
		// Where the salt or the multimodal item travels: vLLM's extra_keys,
		// or SGLang's cache_salt (the salt), TensorRT-LLM's mm_keys or a
		// string token id (the item). The engine hash is the same whatever
		// the carrier: one content, one hash.
		carrier := g.carrier
		if g.extraKeys == extraKeysMixed {
			carrier = rapid.IntRange(0, 2).Draw(t, "carrier")
		}
		salt := rapid.SampledFrom([]string{"salt-a", "salt-b"}).Draw(t, "salt")
		ev.GroupIdx = Some(group)
		ev.KVCacheSpecKind = g.kinds[group]
		n := rapid.IntRange(1, g.maxRun).Draw(t, "blocks")
		if extraKind == 0 && depth == 0 && carrier > 0 {
			ev.CacheSalt = Some(salt)
		}
		for i := 0; i < n; i++ {
			toks := make([]uint32, g.E)
			for j := range toks {
				toks[j] = uint32(rapid.IntRange(0, cmp.Or(g.vocab, 3)-1).Draw(t, "tok"))
			}
			extra := "-"
			switch {
			case extraKind == 0 && depth == 0:
				extra = salt
			case extraKind == 1 && i == n/2:
				extra = "image"
			}
			h := g.hash(parent, toks, rank, group, extra+ev.LoRAName.V)
			ev.BlockHashes = append(ev.BlockHashes, h)
			var raw Raw = Raw{mpNil}
			var mm Raw = Raw{0x90}
			switch {
			case extra == "image" && carrier == 1:
				mm = append(appendArrayHeader(nil, 1), 0x83)
				mm = append(appendStr(appendStr(mm, "type"), "mm_key"), appendStr(appendStr(nil, "hash"), "ab12")...)
				mm = append(appendStr(mm, "start_offset"), 0x00)
			case extra == "image" && carrier == 2:
				ev.StringTokens = append(ev.StringTokens, StringToken{Pos: i * g.E, Value: "img-0"})
				toks[0] = 0
			}
			ev.MMKeys = append(ev.MMKeys, mm)
			ev.TokenIDs = append(ev.TokenIDs, toks...)
			if ev.LoRAName.Valid || (extra != "-" && carrier == 0) {
				var items []byte
				cnt := 0
				if ev.LoRAName.Valid {
					items = appendStr(items, ev.LoRAName.V)
					cnt++
				}
				switch {
				case extra == "image" && carrier == 0:
					items = append(appendArrayHeader(items, 2), appendStr(nil, "img-hash")...)
					items = append(items, 0x03)
					cnt++
				case extra != "-" && carrier == 0:
					items = appendStr(items, salt)
					cnt++
				}
				raw = append(appendArrayHeader(nil, cnt), items...)
			}
			ev.ExtraKeys = append(ev.ExtraKeys, raw)
			g.blocks = append(g.blocks, genBlock{hash: h, rank: rank, group: group, depth: depth})
			parent = h
			depth++
		}
		if rapid.IntRange(0, 19).Draw(t, "bad?") == 0 {
			ev.TokenIDs = ev.TokenIDs[1:] // wrong token count: dropped
			ev.StringTokens = nil
		}
		if rapid.IntRange(0, 4).Draw(t, "pairs?") == 0 && len(ev.StringTokens) == 0 {
			// SGLang's bigram keys carry the same tokens as pairs.
			ev.Pairs, ev.PairNext = true, uint32(rapid.IntRange(0, 2).Draw(t, "pair next"))
		}
		if carrier != 1 || extraKind != 1 {
			ev.MMKeys = nil
		}
		switch g.extraKeys {
		case extraKeysMixed:
			if rapid.IntRange(0, 3).Draw(t, "no extra keys?") == 0 {
				ev.ExtraKeys = nil
			}
		case extraKeysOmitted:
			ev.ExtraKeys = nil
		}
		return ev
	case 4: // offload: tokens-less store of known (or unknown) hashes
		ev := &BlockStored{BlockSize: int64(g.E), Medium: medium, Locality: st.locality}
		for n := rapid.IntRange(1, 4).Draw(t, "n"); n > 0; n-- {
			if b, ok := known("block"); ok {
				ev.BlockHashes = append(ev.BlockHashes, b.hash)
				ev.GroupIdx = Some(b.group)
			} else {
				ev.BlockHashes = append(ev.BlockHashes, rapid.Uint64().Draw(t, "h"))
			}
		}
		return ev
	case 5, 6, 7, 8: // remove known (and unknown) hashes, often a tail run
		ev := &BlockRemoved{Medium: medium, Locality: st.locality, GroupIdx: Some(group)}
		for n := rapid.IntRange(1, 8).Draw(t, "n"); n > 0; n-- {
			if b, ok := known("block"); ok && rapid.IntRange(0, 9).Draw(t, "unknown?") > 0 {
				ev.BlockHashes = append(ev.BlockHashes, b.hash)
				ev.GroupIdx = Some(b.group)
			} else {
				ev.BlockHashes = append(ev.BlockHashes, rapid.Uint64().Draw(t, "h"))
			}
		}
		return ev
	default:
		if rapid.IntRange(0, 3).Draw(t, "clear?") == 0 {
			return &AllBlocksCleared{}
		}
		// A store under a parent the pod never had.
		return &BlockStored{BlockHashes: []uint64{rapid.Uint64().Draw(t, "h")}, ParentBlockHash: Some(rapid.Uint64().Draw(t, "p")),
			TokenIDs: make([]uint32, g.E), BlockSize: int64(g.E), Medium: medium, Locality: st.locality}
	}
}

// TestRekeyerMatchesNaive runs random event sequences through the Rekeyer
// and the naive reference, and after every batch compares the multiset of
// (our hash, tier) that the Rekeyer's ops leave in an index with the one the
// naive reference computes from scratch. Engine/router block size ratios
// 1, 4 and 32 (engine smaller), and 1/4 (engine larger).
func TestRekeyerMatchesNaive(t *testing.T) {
	for _, c := range []struct{ E, R int }{{2, 2}, {2, 8}, {2, 64}, {8, 2}} {
		t.Run(fmt.Sprintf("engine%d-router%d", c.E, c.R), func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				cfg := DefaultRekeyConfig()
				cfg.Model, cfg.BlockSize, cfg.MaxRanks = "m", c.R, 2
				r, err := NewRekeyer(cfg)
				if err != nil {
					t.Fatal(err)
				}
				naive := newNaive("m", c.R)
				idx := &opIndex{m: map[tierHash]int{}}
				gen := &engineGen{E: c.E, maxRun: max(8, 2*c.R/c.E)}
				var ops []Op
				for step := rapid.IntRange(1, 40).Draw(t, "steps"); step > 0; step-- {
					b := gen.batch(t)
					if rapid.Bool().Draw(t, "as a run?") {
						ops = r.ApplyEvents(ops[:0], b.Rank(), b.Events) // what the ingester calls
					} else {
						ops = r.Apply(ops[:0], b)
					}
					idx.apply(t, ops)
					naive.apply(b)
					if want := naive.held(); !maps.Equal(idx.m, want) {
						t.Fatalf("after %s:\nrekeyer holds %s\nnaive holds   %s", AppendJSON(nil, b), fmtHeld(idx.m), fmtHeld(want))
					}
				}
				// Removing everything that is held leaves nothing registered.
				var all []Event
				for _, blk := range naive.blocks {
					for tr := index.Tier(0); tr < index.NumTiers; tr++ {
						if blk.held[tr] {
							all = append(all, &BlockRemoved{BlockHashes: []uint64{blk.key.hash}, Medium: Some(strings.ToUpper(tr.String())),
								Locality: Some("LOCAL"), GroupIdx: Some(int64(blk.key.group))})
						}
					}
				}
				for rank := int64(0); rank < 2; rank++ {
					for _, ev := range all {
						ops = r.ApplyEvent(ops[:0], rank, ev)
						idx.apply(t, ops)
						naive.event(rank, ev)
					}
				}
				if len(idx.m) != 0 || r.Len() != 0 {
					t.Fatalf("after removing everything: %d registrations, %d entries left", len(idx.m), r.Len())
				}
			})
		})
	}
}

func fmtHeld(m map[tierHash]int) string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b tierHash) int {
		if a.hash != b.hash {
			if a.hash < b.hash {
				return -1
			}
			return 1
		}
		return int(a.tier) - int(b.tier)
	})
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "%x/%v×%d ", k.hash, k.tier, m[k])
	}
	return sb.String()
}
