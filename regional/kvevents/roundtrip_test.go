package kvevents

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

// genRaw generates one well-formed, non-empty msgpack value of the shapes
// vLLM puts in extra_keys (nil, strings, ints, bytes, tuples of them).
func genRaw(t *rapid.T, label string, depth int) []byte {
	kinds := 4
	if depth > 0 {
		kinds = 5
	}
	switch rapid.IntRange(0, kinds-1).Draw(t, label+"kind") {
	case 0:
		return []byte{mpNil}
	case 1:
		return appendStr(nil, rapid.StringN(0, 40, -1).Draw(t, label+"str"))
	case 2:
		return appendInt(nil, rapid.Int64().Draw(t, label+"int"))
	case 3:
		b := rapid.SliceOfN(rapid.Byte(), 0, 40).Draw(t, label+"bin")
		return append([]byte{mpBin8, byte(len(b))}, b...)
	default:
		n := rapid.IntRange(0, 4).Draw(t, label+"n")
		out := appendArrayHeader(nil, n)
		for i := 0; i < n; i++ {
			out = append(out, genRaw(t, label+"e", depth-1)...)
		}
		return out
	}
}

func optOf[T any](t *rapid.T, g *rapid.Generator[T], label string) Opt[T] {
	if rapid.Bool().Draw(t, label+"?") {
		return Some(g.Draw(t, label))
	}
	return Opt[T]{}
}

func nilIfEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

func genEvent(t *rapid.T) Event {
	str := rapid.StringN(0, 20, -1)
	switch rapid.IntRange(0, 4).Draw(t, "event") {
	case 0:
		// Well-formed: block_size tokens per hash (or none, as CPU offload
		// sends), in any of the token forms engines use.
		hashes := nilIfEmpty(rapid.SliceOfN(rapid.Uint64(), 0, 8).Draw(t, "hashes"))
		ev := &BlockStored{
			BlockHashes:              hashes,
			ParentBlockHash:          optOf(t, rapid.Uint64(), "parent"),
			BlockSize:                rapid.Int64Range(0, 6).Draw(t, "bs"),
			LoRAID:                   optOf(t, rapid.Int64(), "lora_id"),
			Medium:                   optOf(t, rapid.SampledFrom([]string{"GPU", "CPU", "DISK", "x"}), "medium"),
			GroupIdx:                 optOf(t, rapid.Int64(), "group"),
			KVCacheSpecKind:          optOf(t, str, "kind"),
			KVCacheSpecSlidingWindow: optOf(t, rapid.Int64(), "window"),
			Locality:                 optOf(t, rapid.SampledFrom([]string{"LOCAL", "REMOTE"}), "locality"),
		}
		if ev.BlockSize > 0 && rapid.Bool().Draw(t, "tokens?") {
			ev.TokenIDs = nilIfEmpty(rapid.SliceOfN(rapid.Uint32(), len(hashes)*int(ev.BlockSize), len(hashes)*int(ev.BlockSize)).Draw(t, "tokens"))
		}
		switch form := rapid.IntRange(0, 3).Draw(t, "token form"); {
		case form == 1 && len(ev.TokenIDs) > 0:
			ev.Pairs, ev.PairNext = true, rapid.Uint32().Draw(t, "pair next")
		case form == 2:
			for i := range ev.TokenIDs {
				if rapid.IntRange(0, 3).Draw(t, "string token?") == 0 {
					ev.TokenIDs[i] = 0
					ev.StringTokens = append(ev.StringTokens, StringToken{Pos: i, Value: str.Draw(t, "string token")})
				}
			}
		}
		// lora_name and SGLang's cache_salt share a position in array events.
		if rapid.Bool().Draw(t, "salt?") {
			ev.CacheSalt = Some(str.Draw(t, "salt"))
		} else {
			ev.LoRAName = optOf(t, str, "lora_name")
		}
		if rapid.Bool().Draw(t, "extra?") {
			n := rapid.IntRange(0, 4).Draw(t, "extra n")
			ev.ExtraKeys = []Raw{}
			for i := 0; i < n; i++ {
				ev.ExtraKeys = append(ev.ExtraKeys, genRaw(t, "extra", 2))
			}
		}
		if rapid.Bool().Draw(t, "mm?") {
			ev.MMKeys = []Raw{}
			for range hashes {
				ev.MMKeys = append(ev.MMKeys, genRaw(t, "mm", 2))
			}
		}
		return ev
	case 1:
		return &BlockRemoved{
			BlockHashes: nilIfEmpty(rapid.SliceOfN(rapid.Uint64(), 0, 8).Draw(t, "hashes")),
			Medium:      optOf(t, rapid.SampledFrom([]string{"GPU", "CPU_TIER2", ""}), "medium"),
			GroupIdx:    optOf(t, rapid.Int64(), "group"),
			Locality:    optOf(t, rapid.SampledFrom([]string{"LOCAL", "REMOTE"}), "locality"),
		}
	case 2:
		return &AllBlocksCleared{}
	case 3:
		return &PodUp{Pod: rapid.StringN(1, 20, -1).Draw(t, "pod"), Endpoint: str.Draw(t, "endpoint"),
			Model: str.Draw(t, "model"), Hardware: str.Draw(t, "hw"), Region: str.Draw(t, "region"),
			Epoch: rapid.Uint64().Draw(t, "epoch"), Engine: rapid.SampledFrom([]string{"", "vllm", "sglang", "trtllm"}).Draw(t, "engine"),
			KVBlocks: rapid.Uint64().Draw(t, "kv blocks"),
			TTL:      time.Duration(rapid.IntRange(0, 1e6).Draw(t, "ttl_ms")) * time.Millisecond}
	default:
		return &PodDown{Pod: rapid.StringN(1, 20, -1).Draw(t, "pod"), Epoch: rapid.Uint64().Draw(t, "epoch"),
			Reason: str.Draw(t, "reason")}
	}
}

func genBatch(t *rapid.T) *Batch {
	b := &Batch{
		TS:               rapid.Float64Range(-1e12, 1e12).Draw(t, "ts"),
		DataParallelRank: optOf(t, rapid.Int64(), "rank"),
	}
	n := rapid.IntRange(0, 20).Draw(t, "events")
	for i := 0; i < n; i++ {
		b.Events = append(b.Events, genEvent(t))
	}
	return b
}

// TestRoundTripProperty: for random batches and every encoding,
// decode(encode(x)) == x, with one Decoder reused across all of them (so
// buffer reuse cannot leak one batch into the next).
func TestRoundTripProperty(t *testing.T) {
	d := newTestDecoder(t)
	rapid.Check(t, func(t *rapid.T) {
		b := genBatch(t)
		enc := rapid.SampledFrom(allEncodings()).Draw(t, "encoding")
		msg, err := enc.AppendBatch(nil, b)
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.Decode(msg)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		assertSameBatch(t, b, got)
	})
}

func TestRoundTripFixed(t *testing.T) {
	b := &Batch{TS: 1789095808.83, DataParallelRank: Some[int64](0), Events: []Event{
		&BlockStored{BlockHashes: []uint64{1, 1 << 63}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2,
			Medium: Some("GPU"), ExtraKeys: []Raw{{mpNil}, appendStr(nil, "salt")}},
		&BlockRemoved{BlockHashes: []uint64{1}, Medium: Some("GPU")},
		&AllBlocksCleared{},
		&PodUp{Pod: "p", Endpoint: "http://127.0.0.1:1", Model: "m", Hardware: "h100", Region: "eu", Epoch: 9},
		&PodUp{Pod: "p", Endpoint: "http://127.0.0.1:1", Model: "m", Hardware: "h100", Region: "eu", Epoch: 9, TTL: 30 * time.Second},
		&PodDown{Pod: "p", Epoch: 9, Reason: "drain"},
	}}
	for _, enc := range allEncodings() {
		msg, err := enc.AppendBatch(nil, b)
		if err != nil {
			t.Fatal(err)
		}
		got, err := newTestDecoder(t).Decode(msg)
		if err != nil {
			t.Fatalf("%+v: %v", enc, err)
		}
		assertSameBatch(t, b, got)
	}
	if _, err := (Encoding{}).AppendBatch(nil, &Batch{Events: []Event{nil}}); err == nil {
		t.Fatal("encoding a nil event must fail")
	}
}
