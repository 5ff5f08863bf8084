package summary

import (
	"fmt"
	"testing"

	"github.com/meridian-llm/meridian/index"
)

// BenchmarkBuild1M: a region summary of 1M cached blocks at the default
// 64 KiB budget, from a slice of hashes (the index walk is in
// BenchmarkFromIndex1M).
func BenchmarkBuild1M(b *testing.B) {
	hashes := randomHashes(1, 1_000_000)
	b.ReportAllocs()
	var s *Summary
	for b.Loop() {
		var err error
		if s, err = Build(testInput("us-east-1", 1), hashes, DefaultBuildConfig()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(s.EncodedSize()), "bytes/summary")
	b.ReportMetric(float64(s.SampleRate), "S")
}

// BenchmarkFromIndex1M: the same from a live index holding 1M blocks in
// 1,000 chains over 8 pods (AppendHashes with the sampler).
func BenchmarkFromIndex1M(b *testing.B) {
	x, err := index.New(index.Config{PodCapacity: 64, ExpectedBlocks: 1_000_000})
	if err != nil {
		b.Fatal(err)
	}
	hashes := randomHashes(2, 1_000_000)
	for p := range 8 {
		id, err := x.AddPod(fmt.Sprintf("pod-%d", p))
		if err != nil {
			b.Fatal(err)
		}
		if err := x.Register(id, index.TierGPU, hashes[p*125_000:(p+1)*125_000]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	var s *Summary
	for b.Loop() {
		if s, err = FromIndex(x, testInput("us-east-1", 1), DefaultBuildConfig()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(s.EncodedSize()), "bytes/summary")
}

// BenchmarkDepth: the remote depth estimate against a 1M-block, 64 KiB
// summary, for a 100k-token chain (1,562 blocks) whose first 1,400 blocks
// the region holds, and for a 32-block chain.
func BenchmarkDepth(b *testing.B) {
	f := newForest(3, 1_000_000, 0.7, 4, 2048)
	hashes := f.hashes(nil)
	// One long chain, held to depth 1400.
	chain := make([]uint64, 1562)
	for i := range chain {
		chain[i] = f.fresh()
	}
	hashes = append(hashes, chain[:1400]...)
	s, err := Build(testInput("us-west-2", 1), hashes, DefaultBuildConfig())
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		chain []uint64
	}{{"blocks=1562", chain}, {"blocks=32", chain[:32]}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var d Depth
			for b.Loop() {
				d = s.Depth(c.chain)
			}
			b.ReportMetric(float64(d.Probes), "probes")
			b.ReportMetric(float64(d.Lower), "lower")
		})
	}
}

// BenchmarkCandidate: the whole helper (depth, load terms, age).
func BenchmarkCandidate(b *testing.B) {
	hashes := randomHashes(4, 1_000_000)
	s, err := Build(testInput("us-west-2", 1), hashes, DefaultBuildConfig())
	if err != nil {
		b.Fatal(err)
	}
	chain := hashes[:1562]
	b.ReportAllocs()
	for b.Loop() {
		_ = s.Candidate(testTime, chain, 100_000)
	}
}

// BenchmarkDecode64K: decoding a received 64 KiB summary.
func BenchmarkDecode64K(b *testing.B) {
	s, err := Build(testInput("us-west-2", 1), randomHashes(5, 1_000_000), DefaultBuildConfig())
	if err != nil {
		b.Fatal(err)
	}
	enc, _ := s.MarshalBinary()
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(enc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTradeoff reports the trade-off at 1M blocks for three budgets as
// benchmark metrics (TestTradeoffReport has the full table).
func BenchmarkTradeoff(b *testing.B) {
	f, hashes := tradeoffForest(1_000_000)
	for _, budget := range []int{16 << 10, 64 << 10, 256 << 10} {
		b.Run(fmt.Sprintf("blocks=1M/budget=%dKiB", budget>>10), func(b *testing.B) {
			b.ReportAllocs()
			var row tradeoffRow
			for b.Loop() {
				row = evalTradeoff(b, f, hashes, budget, 0, 5000, 3)
			}
			b.ReportMetric(float64(row.Bytes), "bytes")
			b.ReportMetric(row.MeanLower, "err-mean-blocks")
			b.ReportMetric(row.P99Lower, "err-p99-blocks")
			b.ReportMetric(100*row.FalseMatch, "false-match-%")
			b.ReportMetric(100*row.falseForwardShare(), "false-forward-%")
		})
	}
}
