package audit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/meridian-llm/meridian/global/audit/audittest"
)

func verifyOK(t testing.TB, dir string, cps []Checkpoint) *Report {
	t.Helper()
	rep, err := Verify(dir, cps)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		for _, p := range rep.Problems {
			t.Errorf("unexpected problem: %s", p)
		}
		t.FailNow()
	}
	return rep
}

func TestConcurrentAppendsChainAndVerify(t *testing.T) {
	root := t.TempDir()
	reg := prometheus.NewRegistry()
	l := openTest(t, testConfig(root, "us-east-1-a"), Deps{Registerer: reg})
	const writers, per = 16, 50
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				mustAppend(t, l, testEntry(w*per+i))
			}
		}()
	}
	wg.Wait()
	cp := l.Checkpoint()
	if cp.LastSeq != writers*per || cp.Count != writers*per || cp.Segment != SegmentName(1) {
		t.Fatalf("checkpoint %+v", cp)
	}
	if got := counterValue(l.m.records); got != writers*per {
		t.Fatalf("records_total %v", got)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rep := verifyOK(t, root, []Checkpoint{cp})
	if c := rep.Chains[0]; c.Records != writers*per || c.LastSeq != writers*per || c.Head != cp.Head || c.Anchored != writers*per {
		t.Fatalf("summary %+v", c)
	}
	// Every decision id appears exactly once.
	recs, err := NaiveQuery(root, Query{}, l.Hasher())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range recs {
		seen[r.DecisionID]++
	}
	for i := range writers * per {
		if n := seen[fmt.Sprintf("d-%d", i)]; n != 1 {
			t.Fatalf("decision d-%d recorded %d times", i, n)
		}
	}
}

func TestCloseIdempotentAndAppendAfterClose(t *testing.T) {
	l, err := Open(testConfig(t.TempDir(), "c"), Deps{})
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, l, testEntry(0))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	err = l.Append(context.Background(), testEntry(1))
	var ae *AppendError
	if !errors.As(err, &ae) || !errors.Is(err, ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
}

func TestAppendContextDone(t *testing.T) {
	l := openTest(t, testConfig(t.TempDir(), "c"), Deps{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := l.Append(ctx, testEntry(0))
	var ae *AppendError
	if !errors.As(err, &ae) || !errors.Is(err, context.Canceled) {
		t.Fatalf("append with a done context: %v", err)
	}
}

func TestInvalidEntryWritesNothing(t *testing.T) {
	root := t.TempDir()
	l := openTest(t, testConfig(root, "c"), Deps{})
	e := testEntry(0)
	e.Origin = ""
	var ee *EntryError
	if err := l.Append(context.Background(), e); !errors.As(err, &ee) || ee.Field != "origin" {
		t.Fatalf("got %v", err)
	}
	if cp := l.Checkpoint(); cp.LastSeq != 0 {
		t.Fatalf("something was written: %+v", cp)
	}
}

func TestConfigValidate(t *testing.T) {
	base := testConfig("/tmp/x", "c")
	cases := map[string]func(*Config){
		"Dir":                func(c *Config) { c.Dir = "" },
		"ControllerID":       func(c *Config) { c.ControllerID = "../etc" },
		"HMACKey":            func(c *Config) { c.HMACKey = []byte("k") },
		"MaxSegmentBytes":    func(c *Config) { c.MaxSegmentBytes = 10 },
		"MaxSegmentAge":      func(c *Config) { c.MaxSegmentAge = time.Millisecond },
		"IndexEvery":         func(c *Config) { c.IndexEvery = 0 },
		"MaxBatch":           func(c *Config) { c.MaxBatch = 0 },
		"QueueLen":           func(c *Config) { c.QueueLen = 0 },
		"CheckpointInterval": func(c *Config) { c.CheckpointInterval = 5 * time.Second },
		"CheckpointTimeout":  func(c *Config) { c.CheckpointTimeout = 0 },
	}
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	for field, edit := range cases {
		c := base
		edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: got %v", field, err)
		}
	}
}

func TestRotationBySizeChainsAcrossSegments(t *testing.T) {
	root := t.TempDir()
	cfg := testConfig(root, "c")
	cfg.MaxSegmentBytes = 4096
	cfg.IndexEvery = 3
	l := openTest(t, cfg, Deps{})
	for i := range 40 {
		mustAppend(t, l, testEntry(i))
	}
	cp := l.Checkpoint()
	l.Close()
	dir := controllerDir(root, "c")
	names := segmentNames(t, dir)
	if len(names) < 4 {
		t.Fatalf("segments %v: want rotation by size", names)
	}
	// Each segment starts where the previous ended, and its first record
	// holds the previous segment's last hash.
	var prevHash string
	var next uint64 = 1
	for _, name := range names {
		lines := readLines(t, filepath.Join(dir, name))
		if want := SegmentName(next); name != want {
			t.Fatalf("segment %s, want %s", name, want)
		}
		for i, line := range lines {
			c, _ := checkLine([]byte(line), nil)
			if !c.hashOK || c.rec.Seq != next || (prevHash != "" && c.rec.Prev != prevHash) {
				t.Fatalf("%s line %d: %+v", name, i+1, c)
			}
			prevHash, next = c.rec.Hash, next+1
		}
		entries, seal := readIndex(filepath.Join(dir, indexName(name)))
		if seal == nil || seal.Count != uint64(len(lines)) || len(entries) != (len(lines)+2)/3 {
			t.Fatalf("%s: index %d entries, seal %+v for %d lines", name, len(entries), seal, len(lines))
		}
	}
	verifyOK(t, root, []Checkpoint{cp})
}

func TestRotationByAge(t *testing.T) {
	root := t.TempDir()
	clock := audittest.NewClock(testStart)
	cfg := testConfig(root, "c")
	l := openTest(t, cfg, Deps{Clock: clock})
	mustAppend(t, l, testEntry(0))
	clock.Advance(cfg.MaxSegmentAge - time.Second)
	mustAppend(t, l, testEntry(1))
	if n := len(segmentNames(t, l.Dir())); n != 1 {
		t.Fatalf("%d segments before the age limit", n)
	}
	clock.Advance(time.Second)
	mustAppend(t, l, testEntry(2))
	if got := segmentNames(t, l.Dir()); len(got) != 2 || got[1] != SegmentName(3) {
		t.Fatalf("segments %v after the age limit", got)
	}
	// An idle log does not rotate an empty segment.
	clock.Advance(3 * cfg.MaxSegmentAge)
	if n := len(segmentNames(t, l.Dir())); n != 2 {
		t.Fatalf("%d segments", n)
	}
	l.Close()
	verifyOK(t, root, nil)
}

// TestTimesNeverGoBack: record times never decrease, and a wall clock
// that steps back is not hidden: it is counted and its step measured.
func TestTimesNeverGoBack(t *testing.T) {
	root := t.TempDir()
	clock := audittest.NewClock(testStart)
	reg := prometheus.NewRegistry()
	l := openTest(t, testConfig(root, "c"), Deps{Clock: clock, Registerer: reg})
	mustAppend(t, l, testEntry(0))
	clock.Set(testStart.Add(-time.Hour)) // the wall clock steps back
	mustAppend(t, l, testEntry(1))
	if n, by := testutil.ToFloat64(l.m.clockBack), testutil.ToFloat64(l.m.clockBackBy); n != 1 || by != 3600 {
		t.Fatalf("clock regression counted %v times, %v s; want once, 3600 s", n, by)
	}
	clock.Set(testStart.Add(time.Minute))
	mustAppend(t, l, testEntry(2))
	l.Close()
	recs, err := NaiveQuery(root, Query{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Time{testStart, testStart, testStart.Add(time.Minute)}
	for i, r := range recs {
		if !r.Time.Equal(want[i]) {
			t.Fatalf("record %d time %s, want %s", i, r.Time, want[i])
		}
	}
}

func TestCheckpointsEveryInterval(t *testing.T) {
	root := t.TempDir()
	clock := audittest.NewClock(testStart)
	sink := newChanSink()
	cfg := testConfig(root, "c")
	cfg.CheckpointInterval = 10 * time.Second
	l := openTest(t, cfg, Deps{Clock: clock, Sink: sink})

	tick(t, clock, 10*time.Second) // nothing written: no checkpoint
	for i := range 5 {
		mustAppend(t, l, testEntry(i))
	}
	tick(t, clock, 9*time.Second)
	tick(t, clock, time.Second) // the loop parks again only after a full interval
	cp := recv(t, sink.ch)
	if cp.LastSeq != 5 || cp.Count != 5 || cp.Controller != "c" || cp.Segment != SegmentName(1) || !cp.Time.Equal(testStart.Add(20*time.Second)) {
		t.Fatalf("checkpoint %+v", cp)
	}
	// The head did not move: the next tick publishes nothing.
	tick(t, clock, 10*time.Second)
	tick(t, clock, 10*time.Second) // the loop went round once more
	if got := sink.drain(); len(got) != 0 {
		t.Fatalf("checkpoint without new records: %+v", got)
	}
	// A failing sink is retried at the next tick and never blocks appends.
	sink.setErr(errSinkDown)
	mustAppend(t, l, testEntry(5))
	tick(t, clock, 10*time.Second)
	tick(t, clock, 10*time.Second)
	if got := counterValue(l.m.checkpoints.WithLabelValues("error")); got < 1 {
		t.Fatalf("checkpoint errors %v", got)
	}
	sink.setErr(nil)
	tick(t, clock, 10*time.Second)
	if cp := recv(t, sink.ch); cp.LastSeq != 6 {
		t.Fatalf("retried checkpoint %+v", cp)
	}
	// Close publishes the final head if it moved.
	mustAppend(t, l, testEntry(6))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	final := recv(t, sink.ch)
	if final.LastSeq != 7 {
		t.Fatalf("final checkpoint %+v", final)
	}
	verifyOK(t, root, []Checkpoint{cp, final})
}

func TestReopenContinuesChain(t *testing.T) {
	root := t.TempDir()
	cfg := testConfig(root, "c")
	for round := range 3 {
		l := openTest(t, cfg, Deps{})
		for i := range 4 {
			mustAppend(t, l, testEntry(round*4+i))
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// A reopen without appends leaves an empty segment that the next
	// open reuses.
	for range 2 {
		l := openTest(t, cfg, Deps{})
		l.Close()
	}
	l := openTest(t, cfg, Deps{})
	mustAppend(t, l, testEntry(99))
	cp := l.Checkpoint()
	l.Close()
	if got, want := strings.Join(segmentNames(t, l.Dir()), " "), strings.Join([]string{SegmentName(1), SegmentName(5), SegmentName(9), SegmentName(13)}, " "); got != want {
		t.Fatalf("segments %s, want %s", got, want)
	}
	if cp.LastSeq != 13 || cp.Segment != SegmentName(13) || cp.Count != 1 {
		t.Fatalf("checkpoint %+v", cp)
	}
	verifyOK(t, root, []Checkpoint{cp})
}

func TestReopenCutsTornTail(t *testing.T) {
	root := t.TempDir()
	cfg := testConfig(root, "c")
	l := openTest(t, cfg, Deps{})
	for i := range 3 {
		mustAppend(t, l, testEntry(i))
	}
	l.Close()
	seg := filepath.Join(l.Dir(), SegmentName(1))
	full, _ := os.ReadFile(seg)
	torn := `{"v":1,"controller":"c","seq":4,"ts":"2026-`
	if err := os.WriteFile(seg, append(full, torn...), 0o640); err != nil {
		t.Fatal(err)
	}
	if rep, _ := Verify(root, nil); rep.OK() || rep.Problems[0].Kind != ProblemTorn || rep.Problems[0].Line != 4 {
		t.Fatalf("verify before repair: %+v", rep.Problems)
	}
	l = openTest(t, cfg, Deps{})
	mustAppend(t, l, testEntry(3))
	l.Close()
	after, _ := os.ReadFile(seg)
	if string(after) != string(full) {
		t.Fatal("torn tail not cut back to the last complete record")
	}
	kept, err := os.ReadFile(seg + tornExt)
	if err != nil || !strings.Contains(string(kept), `seq\":4`) {
		t.Fatalf("torn bytes not kept aside: %q, %v", kept, err)
	}
	verifyOK(t, root, nil)
}

func TestReopenRefusesCorruptSegment(t *testing.T) {
	root := t.TempDir()
	cfg := testConfig(root, "c")
	l := openTest(t, cfg, Deps{})
	for i := range 3 {
		mustAppend(t, l, testEntry(i))
	}
	l.Close()
	seg := filepath.Join(l.Dir(), SegmentName(1))
	lines := readLines(t, seg)
	lines[1] = strings.Replace(lines[1], `"pod":"pod-1"`, `"pod":"pod-9"`, 1)
	writeLines(t, seg, lines)
	os.Remove(filepath.Join(l.Dir(), indexName(SegmentName(1)))) // force a full scan
	_, err := Open(cfg, Deps{})
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Line != 2 || ce.Segment != seg {
		t.Fatalf("open of an edited segment: %v", err)
	}
}

func TestOpenUnwritableDir(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "not-a-dir")
	os.WriteFile(file, nil, 0o640)
	if _, err := Open(testConfig(file, "c"), Deps{}); err == nil {
		t.Fatal("open under a regular file succeeded")
	}
	if os.Geteuid() == 0 {
		t.Log("running as root: directory permissions are not enforced; the read-only case is covered by the fault FS tests")
		return
	}
	ro := filepath.Join(root, "ro")
	os.Mkdir(ro, 0o500)
	if _, err := Open(testConfig(ro, "c"), Deps{}); err == nil {
		t.Fatal("open in a read-only directory succeeded")
	}
}

func TestWriteFailureFailsClosedThenRecovers(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   string
		set  func(*faultFS, error)
		want error
	}{
		{"disk full", "write", func(f *faultFS, e error) { f.write = e }, syscall.ENOSPC},
		{"fsync error", "sync", func(f *faultFS, e error) { f.sync = e }, syscall.EIO},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			ffs := &faultFS{}
			reg := prometheus.NewRegistry()
			l := openTest(t, testConfig(root, "c"), Deps{FS: ffs, Registerer: reg})
			mustAppend(t, l, testEntry(0))
			ffs.set(func(f *faultFS) { tc.set(f, tc.want) })
			err := l.Append(context.Background(), testEntry(1))
			var ae *AppendError
			if !errors.As(err, &ae) || ae.Op != tc.op || !errors.Is(err, tc.want) || !strings.HasSuffix(ae.Path, SegmentName(1)) {
				t.Fatalf("append on %s: %v", tc.name, err)
			}
			if cp := l.Checkpoint(); cp.LastSeq != 1 {
				t.Fatalf("head moved past a failed record: %+v", cp)
			}
			if got := counterValue(l.m.writeErrors.WithLabelValues(tc.op)); got != 1 {
				t.Fatalf("write errors{op=%s} = %v", tc.op, got)
			}
			ffs.set(func(f *faultFS) { tc.set(f, nil) })
			mustAppend(t, l, testEntry(2))
			cp := l.Checkpoint()
			l.Close()
			verifyOK(t, root, []Checkpoint{cp})
			recs, _ := NaiveQuery(root, Query{}, nil)
			if len(recs) != 2 || recs[0].DecisionID != "d-0" || recs[1].DecisionID != "d-2" || recs[1].Seq != 2 {
				t.Fatalf("records after recovery: %+v", recs)
			}
		})
	}
}

// When the failed batch cannot even be cut off, the log moves to a new
// segment; the garbage stays where Verify will point at it.
func TestFailedRollbackStartsNewSegment(t *testing.T) {
	root := t.TempDir()
	ffs := &faultFS{}
	l := openTest(t, testConfig(root, "c"), Deps{FS: ffs})
	mustAppend(t, l, testEntry(0))
	ffs.set(func(f *faultFS) { f.sync, f.truncate = syscall.EIO, syscall.EIO })
	if err := l.Append(context.Background(), testEntry(1)); err == nil {
		t.Fatal("append with a failing fsync succeeded")
	}
	ffs.set(func(f *faultFS) { f.sync, f.truncate = nil, nil })
	mustAppend(t, l, testEntry(2))
	l.Close()
	if got := segmentNames(t, l.Dir()); len(got) != 2 || got[1] != SegmentName(2) {
		t.Fatalf("segments %v", got)
	}
	rep, _ := Verify(root, nil)
	if len(rep.Problems) != 1 || rep.Problems[0].Kind != ProblemInserted || rep.Problems[0].Segment != SegmentName(1) || rep.Problems[0].Line != 2 {
		t.Fatalf("problems %v", rep.Problems)
	}
}

func TestRotationFailureIsTyped(t *testing.T) {
	root := t.TempDir()
	ffs := &faultFS{}
	clock := audittest.NewClock(testStart)
	cfg := testConfig(root, "c")
	l := openTest(t, cfg, Deps{FS: ffs, Clock: clock})
	mustAppend(t, l, testEntry(0))
	ffs.set(func(f *faultFS) {
		f.open = func(name string) error {
			if strings.HasSuffix(name, segmentExt) {
				return syscall.EROFS
			}
			return nil
		}
	})
	clock.Advance(cfg.MaxSegmentAge)
	err := l.Append(context.Background(), testEntry(1))
	var ae *AppendError
	if !errors.As(err, &ae) || ae.Op != "rotate" || !errors.Is(err, syscall.EROFS) {
		t.Fatalf("append needing a new segment on a read-only fs: %v", err)
	}
	ffs.set(func(f *faultFS) { f.open = nil })
	mustAppend(t, l, testEntry(2))
	l.Close()
	verifyOK(t, root, nil)
}

func TestMetricsRegistered(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := openTest(t, testConfig(t.TempDir(), "c"), Deps{Registerer: reg})
	mustAppend(t, l, testEntry(0))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"meridian_audit_records_total", "meridian_audit_bytes_total", "meridian_audit_fsync_seconds", "meridian_audit_batch_records", "meridian_audit_queue_depth"} {
		if !names[n] {
			t.Errorf("metric %s not registered", n)
		}
	}
	if _, err := Open(testConfig(t.TempDir(), "d"), Deps{Registerer: reg}); err == nil {
		t.Fatal("a second log on the same registerer should fail to register")
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// The first batch of a fresh segment fails and cannot be cut off; then
// re-creating the segment fails too (read-only for a moment). The log
// refuses both records and recovers once the file system does.
func TestDamagedEmptySegmentIsRecreated(t *testing.T) {
	root := t.TempDir()
	ffs := &faultFS{}
	l := openTest(t, testConfig(root, "c"), Deps{FS: ffs})
	ffs.set(func(f *faultFS) { f.sync, f.truncate = syscall.EIO, syscall.EIO })
	if err := l.Append(context.Background(), testEntry(0)); err == nil {
		t.Fatal("append with a failing fsync succeeded")
	}
	ffs.set(func(f *faultFS) {
		f.sync, f.truncate = nil, nil
		f.open = func(name string) error {
			if strings.HasSuffix(name, segmentExt) {
				return syscall.EROFS
			}
			return nil
		}
	})
	var ae *AppendError
	if err := l.Append(context.Background(), testEntry(1)); !errors.As(err, &ae) || ae.Op != "rotate" {
		t.Fatalf("append while the segment cannot be re-created: %v", err)
	}
	ffs.set(func(f *faultFS) { f.open = nil })
	mustAppend(t, l, testEntry(2))
	cp := l.Checkpoint()
	l.Close()
	if cp.LastSeq != 1 || cp.Segment != SegmentName(1) {
		t.Fatalf("checkpoint %+v", cp)
	}
	verifyOK(t, root, []Checkpoint{cp})
	recs, _ := NaiveQuery(root, Query{}, nil)
	if len(recs) != 1 || recs[0].DecisionID != "d-2" {
		t.Fatalf("records %v", keys(recs))
	}
}
