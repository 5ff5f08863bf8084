package kvevents

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/index"
)

// fleetEngine is one engine kind as TestMixedFleetMatchesNaiveIndex runs
// it: the wire forms it writes and the carriers it has for a cache salt and
// a multimodal item (see engineGen.event).
type fleetEngine struct {
	kind      string
	encodings []Encoding
	carriers  []int
}

// fleetEngines: vLLM writes every encoding Meridian reads (array or map
// events and envelope; unsigned, signed or bytes hashes) and carries salts
// and multimodal items in extra_keys; SGLang writes array events (the
// salted ones as BlockStoredWithMetadata) or map events with a top-level
// cache_salt, in an array envelope, with signed hashes (hash_str_to_int64),
// and [token, next] pairs for DeepSeek V4; TensorRT-LLM writes map events
// with unsigned hashes, mm_keys or string token ids, and no salt.
var fleetEngines = func() []fleetEngine {
	var vllm []Encoding
	for _, ev := range []EventStyle{EventsArray, EventsMap} {
		for _, env := range []EnvelopeStyle{EnvelopeArray, EnvelopeMap} {
			for _, h := range []HashStyle{HashUint, HashInt, HashBytes} {
				vllm = append(vllm, Encoding{Events: ev, Envelope: env, Hashes: h})
			}
		}
	}
	return []fleetEngine{
		{EngineVLLM, vllm, []int{0}},
		{EngineSGLang, []Encoding{{Events: EventsArray, Hashes: HashInt}, {Events: EventsMap, Hashes: HashInt}}, []int{1}},
		{EngineTRTLLM, []Encoding{{Events: EventsMap}}, []int{1, 2}},
	}
}()

// shape strips from a generated batch what this engine kind never sends:
// extra_keys and LoRA names outside vLLM (SGLang and TensorRT-LLM send
// lora_id), salts from TensorRT-LLM, mm_keys outside TensorRT-LLM, and
// token pairs outside SGLang.
func (f fleetEngine) shape(b *Batch) {
	for _, ev := range b.Events {
		st, ok := ev.(*BlockStored)
		if !ok || f.kind == EngineVLLM {
			if ok {
				st.Pairs = false
			}
			continue
		}
		st.ExtraKeys = nil
		if st.LoRAName.Valid {
			st.LoRAName, st.LoRAID = Opt[string]{}, Some[int64](1)
		}
		switch f.kind {
		case EngineSGLang:
			st.MMKeys = nil
		case EngineTRTLLM:
			st.CacheSalt, st.Pairs = Opt[string]{}, false
		}
	}
}

// fleetPod is one pod of the fleet: its engine, wire form, generator,
// decoder and re-keyer, the naive reference of what it holds, and its slot
// in the index.
type fleetPod struct {
	engine fleetEngine
	enc    Encoding
	gen    *engineGen
	dec    *Decoder
	rk     *Rekeyer
	naive  *naiveRekeyer
	id     index.PodID
}

// TestMixedFleetMatchesNaiveIndex: a pod set of random engine kinds, each
// publishing in one of its engine's wire forms with its own engine block
// size, feeds one index through the decoder and a re-keyer per pod, as the
// ingester does. After every batch, lookups of every chain any pod holds,
// in its own namespace and in the other salts', answer what a naive scan of
// the pods' naive references answers: which pods hold the first block, and
// for each the documented bounds of Index.Lookup (at least the consecutive
// run, and a held block followed by one not held). So the same salted
// tokens index identically from SGLang and vLLM, a salt never matches
// another's blocks, and a malformed event (a wrong token count) costs only
// itself.
func TestMixedFleetMatchesNaiveIndex(t *testing.T) {
	const R = 4
	rapid.Check(t, func(t *rapid.T) {
		idx, err := index.New(index.Config{PodCapacity: 64})
		if err != nil {
			t.Fatal(err)
		}
		pods := make([]*fleetPod, rapid.IntRange(2, 4).Draw(t, "pods"))
		// With one token id every sequence of one length is the same
		// tokens: pods meet on them, in every namespace.
		vocab := rapid.IntRange(1, 2).Draw(t, "vocab")
		for i := range pods {
			eng := rapid.SampledFrom(fleetEngines).Draw(t, "engine")
			E := rapid.SampledFrom([]int{2, 4, 8}).Draw(t, "engine block size")
			cfg := DefaultRekeyConfig()
			cfg.Model, cfg.BlockSize, cfg.MaxRanks = "m", R, 2
			rk, err := NewRekeyer(cfg)
			if err != nil {
				t.Fatal(err)
			}
			dec, err := NewDecoder(DefaultDecoderConfig())
			if err != nil {
				t.Fatal(err)
			}
			id, err := idx.AddPod(fmt.Sprintf("pod-%d-%s", i, eng.kind))
			if err != nil {
				t.Fatal(err)
			}
			mode := extraKeysSent
			if eng.kind == EngineVLLM && rapid.Bool().Draw(t, "extra keys omitted") {
				mode = extraKeysOmitted
			}
			pods[i] = &fleetPod{engine: eng, enc: rapid.SampledFrom(eng.encodings).Draw(t, "encoding"),
				gen: &engineGen{E: E, maxRun: max(8, 2*R/E), extraKeys: mode, carriers: eng.carriers, extraOdds: 3, vocab: vocab},
				dec: dec, rk: rk, naive: newNaive("m", R), id: id}
		}
		var ops []Op
		var msg []byte
		for step := rapid.IntRange(1, 30).Draw(t, "steps"); step > 0; step-- {
			p := rapid.SampledFrom(pods).Draw(t, "pod")
			b := p.gen.batch(t)
			p.engine.shape(b)
			if msg, err = p.enc.AppendBatch(msg[:0], b); err != nil {
				t.Fatalf("%s %+v: encode: %v", p.engine.kind, p.enc, err)
			}
			got, err := p.dec.Decode(msg)
			if err != nil {
				t.Fatalf("%s %+v: decode: %v", p.engine.kind, p.enc, err)
			}
			for _, s := range got.Skipped {
				if s.Reason != ReasonBadTokenCount {
					t.Fatalf("%s %+v: event %d skipped: %s (%s)", p.engine.kind, p.enc, s.Index, s.Reason, s.Detail)
				}
			}
			ops = p.rk.Apply(ops[:0], got)
			for _, op := range ops {
				switch op.Kind {
				case OpRegister:
					err = idx.Register(p.id, op.Tier, op.Hashes)
				case OpEvict:
					err = idx.Evict(p.id, op.Tier, op.Hashes)
				case OpClearPod:
					err = idx.ClearPod(p.id)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			p.naive.apply(b)
			checkFleet(t, idx, pods, R)
		}
	})
}

// checkFleet compares the index's answers with a naive scan of what each
// pod's naive reference holds, for the chains of every block any pod has
// seen, in its namespace and the others.
func checkFleet(t *rapid.T, idx *index.Index, pods []*fleetPod, R int) {
	held := make(map[index.PodID]map[uint64]bool, len(pods))
	for _, p := range pods {
		hs := map[uint64]bool{}
		for k := range p.naive.held() {
			hs[k.hash] = true
		}
		held[p.id] = hs
	}
	var dst []index.Match
	seen := map[uint64]bool{}
	for _, p := range pods {
		for _, blk := range p.naive.blocks {
			var chain []*naiveBlock
			for b := blk; b != nil; b = b.parent {
				chain = append(chain, b)
			}
			slices.Reverse(chain)
			var toks []uint32
			for _, b := range chain {
				toks = append(toks, b.tokens...)
			}
			root := chain[0]
			for _, salt := range []string{root.salt, "", "salt-a", "salt-b"} {
				q := index.ChainHashes(index.Namespace{Model: "m", LoRA: root.lora, CacheSalt: salt, BlockSize: R}, toks, nil)
				if len(q) == 0 || seen[q[len(q)-1]] {
					continue
				}
				seen[q[len(q)-1]] = true
				dst = idx.Lookup(q, dst)
				got := map[index.PodID]int{}
				for _, m := range dst {
					got[m.Pod] = m.Blocks
				}
				for _, o := range pods {
					hs := held[o.id]
					d, ok := got[o.id]
					if ok != hs[q[0]] {
						t.Fatalf("lookup of %d blocks (salt %q): pod %s in answer %v, holds the first block %v",
							len(q), salt, o.engine.kind, ok, hs[q[0]])
					}
					if !ok {
						continue
					}
					c := 0
					for c < len(q) && hs[q[c]] {
						c++
					}
					if d < c || d > len(q) || !hs[q[d-1]] || (d < len(q) && hs[q[d]]) {
						t.Fatalf("lookup of %d blocks (salt %q): pod %s answered %d; naive: run of %d, holds %v",
							len(q), salt, o.engine.kind, d, c, heldMask(hs, q))
					}
				}
			}
		}
	}
}

func heldMask(hs map[uint64]bool, q []uint64) string {
	b := make([]byte, len(q))
	for i, h := range q {
		b[i] = '.'
		if hs[h] {
			b[i] = 'x'
		}
	}
	return string(b)
}
