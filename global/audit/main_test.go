package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meridian-llm/meridian/global/audit/audittest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	testKey   = []byte("0123456789abcdef0123456789abcdef")
	testStart = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
)

func testConfig(dir, controller string) Config {
	cfg := DefaultConfig()
	cfg.Dir = dir
	cfg.ControllerID = controller
	cfg.HMACKey = testKey
	return cfg
}

// openTest opens a log and closes it at the end of the test.
func openTest(t testing.TB, cfg Config, deps Deps) *Log {
	t.Helper()
	l, err := Open(cfg, deps)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func testEntry(i int) Entry {
	regions := []string{"us-east-1", "us-west-2", "eu-west-1", "ap-southeast-1"}
	kinds := []Kind{KindCrossRegion, KindResidencyDenied, KindForwardedIn}
	return Entry{
		Kind:          kinds[i%len(kinds)],
		DecisionID:    fmt.Sprintf("d-%d", i),
		RequestID:     fmt.Sprintf("r-%d", i),
		Tenant:        fmt.Sprintf("tenant-%d", i%5),
		Session:       fmt.Sprintf("session-%d", i%7),
		Origin:        regions[i%len(regions)],
		Region:        regions[(i+1)%len(regions)],
		Pod:           fmt.Sprintf("pod-%d", i%3),
		DataClass:     []string{"public", "pii", "phi"}[i%3],
		Rule:          "default-stay-in-zone",
		PolicyVersion: "7",
		Cost:          json.RawMessage(fmt.Sprintf(`{"winner":%q,"margin_ms":%d.5,"candidates":[{"region":"us-east-1","rtt_ms":0},{"region":"us-west-2","rtt_ms":65}]}`, regions[(i+1)%len(regions)], i)),
	}
}

func mustAppend(t testing.TB, l *Log, e Entry) {
	t.Helper()
	if err := l.Append(context.Background(), e); err != nil {
		t.Fatalf("append %s: %v", e.DecisionID, err)
	}
}

// chanSink collects checkpoints.
type chanSink struct {
	ch  chan Checkpoint
	mu  sync.Mutex
	err error
}

func newChanSink() *chanSink { return &chanSink{ch: make(chan Checkpoint, 100)} }

func (s *chanSink) PublishCheckpoint(_ context.Context, cp Checkpoint) error {
	s.mu.Lock()
	err := s.err
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.ch <- cp
	return nil
}

func (s *chanSink) setErr(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

func (s *chanSink) drain() []Checkpoint {
	var out []Checkpoint
	for {
		select {
		case cp := <-s.ch:
			out = append(out, cp)
		default:
			return out
		}
	}
}

// tick advances the clock by d once the checkpoint loop is parked on it,
// and returns once the loop has handled the tick and parked again: the
// test's next step never races the loop's reading of the chain head.
func tick(t testing.TB, c *audittest.Clock, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitForWaiters(ctx, 1); err != nil {
		t.Fatalf("checkpoint loop never waited on the clock: %v", err)
	}
	c.Advance(d)
	if err := c.WaitForWaiters(ctx, 1); err != nil {
		t.Fatalf("checkpoint loop did not park again after the tick: %v", err)
	}
}

func recv[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for a value")
	}
	var zero T
	return zero
}

func segmentNames(t testing.TB, dir string) []string {
	t.Helper()
	segs, err := listSegments(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range segs {
		out = append(out, s.name)
	}
	return out
}

func readLines(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.TrimSuffix(string(b), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func writeLines(t testing.TB, path string, lines []string) {
	t.Helper()
	s := strings.Join(lines, "\n")
	if len(lines) > 0 {
		s += "\n"
	}
	if err := os.WriteFile(path, []byte(s), 0o640); err != nil {
		t.Fatal(err)
	}
}

// faultFS wraps OSFS and fails chosen operations.
type faultFS struct {
	OSFS
	mu       sync.Mutex
	write    error // returned by File.Write
	sync     error // returned by File.Sync of segment files
	truncate error // returned by File.Truncate
	open     func(name string) error
}

func (f *faultFS) set(fn func(*faultFS)) {
	f.mu.Lock()
	fn(f)
	f.mu.Unlock()
}

func (f *faultFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f.mu.Lock()
	open := f.open
	f.mu.Unlock()
	if open != nil {
		if err := open(name); err != nil {
			return nil, &fs.PathError{Op: "open", Path: name, Err: err}
		}
	}
	file, err := f.OSFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f, segment: strings.HasSuffix(name, segmentExt)}, nil
}

type faultFile struct {
	File
	fs      *faultFS
	segment bool
}

func (f *faultFile) Write(b []byte) (int, error) {
	f.fs.mu.Lock()
	err := f.fs.write
	f.fs.mu.Unlock()
	if err != nil && f.segment {
		// A partial write, as a full disk gives.
		n, _ := f.File.Write(b[:len(b)/2])
		return n, err
	}
	return f.File.Write(b)
}

func (f *faultFile) Sync() error {
	f.fs.mu.Lock()
	err := f.fs.sync
	f.fs.mu.Unlock()
	if err != nil && f.segment {
		return err
	}
	return f.File.Sync()
}

func (f *faultFile) Truncate(n int64) error {
	f.fs.mu.Lock()
	err := f.fs.truncate
	f.fs.mu.Unlock()
	if err != nil {
		return err
	}
	return f.File.Truncate(n)
}

func controllerDir(root, id string) string { return filepath.Join(root, id) }

var errSinkDown = errors.New("raft: no leader")
