package kvevents

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
)

// benchBatch builds one realistic vLLM step: events BlockStored events of
// blocks blocks each (a chain continuing from a parent), with token ids like
// a 150k-vocabulary tokenizer's.
func benchBatch(t testing.TB, events, blocks, blockSize int, enc Encoding) []byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	b := &Batch{TS: 1789095808.83, DataParallelRank: Some[int64](0)}
	for e := 0; e < events; e++ {
		ev := &BlockStored{ParentBlockHash: Some(rng.Uint64()), BlockSize: int64(blockSize),
			Medium: Some("GPU"), KVCacheSpecKind: Some("full_attention")}
		for k := 0; k < blocks; k++ {
			ev.BlockHashes = append(ev.BlockHashes, rng.Uint64())
			for j := 0; j < blockSize; j++ {
				ev.TokenIDs = append(ev.TokenIDs, uint32(rng.IntN(150000)))
			}
		}
		b.Events = append(b.Events, ev)
	}
	msg, err := enc.AppendBatch(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// cpuClock measures a single-goroutine benchmark both by the wall clock
// (blocks/s) and by the CPU time of its thread (cpu-blocks/s: the cost on one
// core, unaffected by other processes on a shared machine).
type cpuClock struct {
	start time.Duration
	ok    bool
}

func startCPU() cpuClock {
	lockThread()
	t, ok := threadCPU()
	return cpuClock{start: t, ok: ok}
}

func (c cpuClock) report(b *testing.B, blocks int) {
	t, ok := threadCPU()
	unlockThread()
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
	if c.ok && ok && t > c.start {
		b.ReportMetric(float64(blocks)/(t-c.start).Seconds(), "cpu-blocks/s")
	}
}

func blocksIn(b *Batch) int {
	n := 0
	for _, ev := range b.Events {
		switch ev := ev.(type) {
		case *BlockStored:
			n += len(ev.BlockHashes)
		case *BlockRemoved:
			n += len(ev.BlockHashes)
		}
	}
	return n
}

// BenchmarkDecode measures decode alone: block events (hashes in BlockStored
// and BlockRemoved) per second, 16 events of 4 blocks of 16 tokens a batch.
func BenchmarkDecode(b *testing.B) {
	for _, c := range []struct {
		name string
		enc  Encoding
	}{
		{"array", Encoding{}},
		{"map", Encoding{Events: EventsMap}},
		{"bytes-hashes", Encoding{Hashes: HashBytes}},
	} {
		b.Run(c.name, func(b *testing.B) {
			msg := benchBatch(b, 16, 4, 16, c.enc)
			d := newTestDecoder(b)
			first, err := d.Decode(msg)
			if err != nil {
				b.Fatal(err)
			}
			blocks := blocksIn(first)
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			cpu := startCPU()
			for b.Loop() {
				if _, err := d.Decode(msg); err != nil {
					b.Fatal(err)
				}
			}
			cpu.report(b, blocks*b.N)
		})
	}
}

// engineStream simulates an engine's event stream in steady state: chains
// of conversations stored in steps of 4 blocks, every other conversation
// sharing its first 8 blocks with the previous one, then all removed in the
// order they were stored. It starts and ends with the pod empty, so a
// benchmark can replay it forever. Returns encoded batches.
func engineStream(tb testing.TB, convs, blocksPerConv, ebs int, enc Encoding) [][]byte {
	tb.Helper()
	rng := rand.New(rand.NewPCG(3, 4))
	next := uint64(1)
	type conv struct{ hashes []uint64 }
	all := make([]conv, convs)
	var evs []Event
	var out [][]byte
	flush := func(force bool) {
		if len(evs) >= 16 || (force && len(evs) > 0) {
			msg, err := enc.AppendBatch(nil, &Batch{TS: 1, Events: evs, DataParallelRank: Some[int64](0)})
			if err != nil {
				tb.Fatal(err)
			}
			out = append(out, msg)
			evs = nil
		}
	}
	for c := range all {
		var parent Opt[uint64]
		start := 0
		if c%2 == 1 && blocksPerConv > 8 {
			parent = Some(all[c-1].hashes[7])
			start = 8
		}
		for k := start; k < blocksPerConv; k += 4 {
			ev := &BlockStored{ParentBlockHash: parent, BlockSize: int64(ebs), Medium: Some("GPU")}
			for j := k; j < k+4 && j < blocksPerConv; j++ {
				ev.BlockHashes = append(ev.BlockHashes, next)
				all[c].hashes = append(all[c].hashes, next)
				next++
				for t := 0; t < ebs; t++ {
					ev.TokenIDs = append(ev.TokenIDs, uint32(rng.IntN(150000)))
				}
			}
			parent = Some(ev.BlockHashes[len(ev.BlockHashes)-1])
			evs = append(evs, ev)
			flush(false)
		}
	}
	for c := range all {
		evs = append(evs, &BlockRemoved{BlockHashes: all[c].hashes, Medium: Some("GPU")})
		flush(false)
	}
	flush(true)
	return out
}

// BenchmarkDecodeApply is the ingest hot path without the index: decode each
// batch and re-key it, block events per second. Router/engine block size
// ratios 1 (64/64) and 4 (64/16).
func BenchmarkDecodeApply(b *testing.B) {
	for _, c := range []struct {
		name     string
		ebs, rbs int
	}{{"ratio1", 64, 64}, {"ratio4", 16, 64}} {
		b.Run(c.name, func(b *testing.B) {
			stream := engineStream(b, 512, 64, c.ebs, Encoding{})
			d := newTestDecoder(b)
			cfg := DefaultRekeyConfig()
			cfg.Model, cfg.BlockSize = "m", c.rbs
			r, err := NewRekeyer(cfg)
			if err != nil {
				b.Fatal(err)
			}
			blocks := 0
			var ops []Op
			for _, msg := range stream {
				batch, err := d.Decode(msg)
				if err != nil {
					b.Fatal(err)
				}
				blocks += blocksIn(batch)
				ops = r.Apply(ops[:0], batch)
			}
			if r.Len() != 0 {
				b.Fatalf("stream leaves %d entries", r.Len())
			}
			b.ReportAllocs()
			cpu := startCPU()
			for b.Loop() {
				for _, msg := range stream {
					batch, _ := d.Decode(msg)
					ops = r.Apply(ops[:0], batch)
				}
			}
			cpu.report(b, blocks*b.N)
		})
	}
}

// BenchmarkDecodeApplyParallel is BenchmarkDecodeApply with one goroutine
// per pod (each with its own Decoder and Rekeyer, as an ingester that
// shards pods across workers would run), so -cpu 2 shows two cores.
func BenchmarkDecodeApplyParallel(b *testing.B) {
	stream := engineStream(b, 512, 64, 16, Encoding{})
	d := newTestDecoder(b)
	blocks := 0
	for _, msg := range stream {
		batch, err := d.Decode(msg)
		if err != nil {
			b.Fatal(err)
		}
		blocks += blocksIn(batch)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		d := newTestDecoder(b)
		cfg := DefaultRekeyConfig()
		cfg.Model = "m"
		r, err := NewRekeyer(cfg)
		if err != nil {
			b.Error(err)
			return
		}
		var ops []Op
		for pb.Next() {
			for _, msg := range stream {
				batch, _ := d.Decode(msg)
				ops = r.Apply(ops[:0], batch)
			}
		}
	})
	b.ReportMetric(float64(blocks*b.N)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkRekeyMemory reports the heap a Rekeyer holds per tracked engine
// block, for E=R (no tokens kept) and E=R/4 (tokens kept for 3 of 4 blocks).
func BenchmarkRekeyMemory(b *testing.B) {
	for _, c := range []struct {
		name string
		ebs  int
	}{{"ratio1", 64}, {"ratio4", 16}} {
		b.Run(c.name, func(b *testing.B) {
			const blocks = 1 << 17
			var perEntry float64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				cfg := DefaultRekeyConfig()
				cfg.Model = "m"
				r, err := NewRekeyer(cfg)
				if err != nil {
					b.Fatal(err)
				}
				toks := make([]uint32, 8*c.ebs)
				for i := 0; i < blocks/8; i++ {
					ev := &BlockStored{BlockSize: int64(c.ebs), TokenIDs: toks, Medium: Some("GPU")}
					for j := 0; j < 8; j++ {
						ev.BlockHashes = append(ev.BlockHashes, uint64(i*8+j+1))
					}
					r.ApplyEvent(nil, 0, ev)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perEntry = float64(after.HeapAlloc-before.HeapAlloc) / float64(r.Len())
				runtime.KeepAlive(r)
			}
			b.ReportMetric(perEntry, "bytes/entry")
		})
	}
}
