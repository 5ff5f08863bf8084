package dr

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/meridian-llm/meridian/dr/drtest"
)

// BenchmarkCheckHealthy checks the tiny generated deployment (14 files).
func BenchmarkCheckHealthy(b *testing.B) {
	dir := b.TempDir()
	if err := drtest.WriteHealthy(dir, drtest.BF16); err != nil {
		b.Fatal(err)
	}
	req := Request{Sources: []Source{{Dir: dir}}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Check(context.Background(), DefaultConfig(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckSparse128GiB checks a folder whose weights are 8 sparse
// shards of 16 GiB each: without checksums the cost is the headers, not
// the 128 GiB.
func BenchmarkCheckSparse128GiB(b *testing.B) {
	dir := b.TempDir()
	if err := drtest.WriteHealthy(dir, drtest.BF16); err != nil {
		b.Fatal(err)
	}
	for i := range 8 {
		p := filepath.Join(dir, fmt.Sprintf("model-extra-%05d.safetensors", i))
		if err := drtest.WriteSparseShard(p, fmt.Sprintf("model.layers.%d.mlp.weight", i+1), 16<<30); err != nil {
			b.Fatal(err)
		}
	}
	req := Request{Sources: []Source{{Dir: dir}}}
	b.ReportAllocs()
	for b.Loop() {
		rep, err := Check(context.Background(), DefaultConfig(), req)
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
