package check

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/meridian-llm/meridian/dr/check/checktest"
	"github.com/meridian-llm/meridian/dr/check/safetensors"
)

// BenchmarkCheckHealthy checks the tiny generated deployment (14 files).
func BenchmarkCheckHealthy(b *testing.B) {
	dir := b.TempDir()
	if err := checktest.WriteHealthy(dir, checktest.BF16); err != nil {
		b.Fatal(err)
	}
	req := Request{Sources: []Source{{Dir: dir}}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Run(context.Background(), DefaultConfig(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckSparse128GiB checks a folder whose weights are 8 sparse
// shards of 16 GiB each: without checksums the cost is the headers, not
// the 128 GiB.
func BenchmarkCheckSparse128GiB(b *testing.B) {
	dir := b.TempDir()
	if err := checktest.WriteHealthy(dir, checktest.BF16); err != nil {
		b.Fatal(err)
	}
	for i := range 8 {
		p := filepath.Join(dir, fmt.Sprintf("model-extra-%05d.safetensors", i))
		if err := checktest.WriteSparseShard(p, fmt.Sprintf("model.layers.%d.mlp.weight", i+1), 16<<30); err != nil {
			b.Fatal(err)
		}
	}
	req := Request{Sources: []Source{{Dir: dir}}}
	b.ReportAllocs()
	for b.Loop() {
		rep, err := Run(context.Background(), DefaultConfig(), req)
		if err != nil {
			b.Fatal(err)
		}
		if rep.Folders[0].Bytes < 128<<30 {
			b.Fatalf("folder holds %d bytes", rep.Folders[0].Bytes)
		}
	}
}

// BenchmarkHash is the SHA-256 throughput of checksumming (MB/s): the cost
// per byte of --checksums always or of a manifest with checksums.
func BenchmarkHash(b *testing.B) {
	dir := b.TempDir()
	data := make([]byte, 64<<20)
	if _, err := rand.Read(data); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "blob"), data, 0o644); err != nil {
		b.Fatal(err)
	}
	fo := &folder{fsys: os.DirFS(dir)}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := fo.hash(context.Background(), "blob"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheck1000Shards checks a model split into 1000 small shards named
// by the index (plus the generated deployment files).
func BenchmarkCheck1000Shards(b *testing.B) {
	dir := b.TempDir()
	if err := checktest.WriteHealthy(dir, checktest.BF16); err != nil {
		b.Fatal(err)
	}
	weightMap := map[string]any{}
	var total uint64
	for i := range 1000 {
		name := fmt.Sprintf("model-%05d-of-01000.safetensors", i+1)
		tensor := fmt.Sprintf("model.layers.%d.weight", i)
		data, err := checktest.Safetensors([]safetensors.Tensor{{Name: tensor, DType: "BF16", Shape: []uint64{4, 4}}}, nil, byte(i))
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			b.Fatal(err)
		}
		weightMap[tensor] = name
		total += 32
	}
	for _, s := range []string{checktest.Shard1, checktest.Shard2} {
		if err := os.Remove(filepath.Join(dir, s)); err != nil {
			b.Fatal(err)
		}
	}
	idx, err := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap})
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644); err != nil {
		b.Fatal(err)
	}
	req := Request{Sources: []Source{{Dir: dir}}}
	b.ReportAllocs()
	for b.Loop() {
		rep, err := Run(context.Background(), DefaultConfig(), req)
		if err != nil {
			b.Fatal(err)
		}
		if rep.Folders[0].Shards != 1000 {
			b.Fatalf("%d shards", rep.Folders[0].Shards)
		}
	}
}
