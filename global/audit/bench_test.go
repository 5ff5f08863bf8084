package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// benchEntry is a cross-region decision with a gorgo-sized explanation:
// three candidates with every cost term.
func benchEntry(i int) Entry {
	e := testEntry(i)
	e.Kind = KindCrossRegion
	e.Cost = json.RawMessage(fmt.Sprintf(`{"winner":"us-west-2","margin_ms":%d.25,"candidates":[`+
		`{"region":"us-east-1","pod":"pod-%d","queue_ms":41.5,"prefill_ms":812.0,"rtt_ms":0,"uncached_tokens":8120,"total_ms":853.5},`+
		`{"region":"us-west-2","pod":"pod-7","queue_ms":12.25,"prefill_ms":38.0,"rtt_ms":65,"uncached_tokens":380,"total_ms":115.25},`+
		`{"region":"eu-west-1","pod":"pod-2","queue_ms":3.0,"prefill_ms":804.0,"rtt_ms":75,"uncached_tokens":8040,"total_ms":882.0}]}`, i%700, i%16))
	return e
}

// BenchmarkAppend measures durable appends (each returns after its batch's
// fsync) from several concurrent appenders on the local disk.
func BenchmarkAppend(b *testing.B) { benchAppend(b, nil) }

// BenchmarkAppendNoFsync is the same with fsync turned into a no-op: not
// durable, it shows what the code costs without the disk's flush latency.
func BenchmarkAppendNoFsync(b *testing.B) { benchAppend(b, noSyncFS{}) }

type noSyncFS struct{ OSFS }

func (noSyncFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return noSyncFile{f}, nil
}

type noSyncFile struct{ *os.File }

func (noSyncFile) Sync() error { return nil }

func benchAppend(b *testing.B, fsys FS) {
	for _, appenders := range []int{1, 16, 64, 256, 1024} {
		b.Run(fmt.Sprintf("appenders=%d", appenders), func(b *testing.B) {
			l, err := Open(testConfig(b.TempDir(), "bench"), Deps{FS: fsys})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			entries := make([]Entry, 1024)
			for i := range entries {
				entries[i] = benchEntry(i)
			}
			b.ReportAllocs()
			var next atomic.Int64
			var wg sync.WaitGroup
			ctx := context.Background()
			b.ResetTimer()
			start := time.Now()
			for range appenders {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1) - 1
						if i >= int64(b.N) {
							return
						}
						if err := l.Append(ctx, entries[i%int64(len(entries))]); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			var m dto.Metric
			l.m.batch.(interface{ Write(*dto.Metric) error }).Write(&m)
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "records/s")
			b.ReportMetric(counterValue(l.m.bytes)/float64(b.N), "bytes/record")
			if n := m.GetHistogram().GetSampleCount(); n > 0 {
				b.ReportMetric(float64(b.N)/float64(n), "records/fsync")
			}
		})
	}
}
