package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/global/audit/audittest"
)

var (
	propRegions = []string{"us-east-1", "us-west-2", "eu-west-1"}
	propTenants = []string{"acme", "globex", "initech"}
	propKinds   = []Kind{KindCrossRegion, KindResidencyDenied, KindForwardedIn}
)

func keys(rs []Record) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = fmt.Sprintf("%s#%d@%s", r.Controller, r.Seq, r.Hash[:8])
	}
	return out
}

// buildRandomLogs writes logs of 1-3 controllers with random records,
// clock steps, index spacing and rotation, and returns the times seen.
func buildRandomLogs(t *rapid.T, root string) []time.Time {
	clock := audittest.NewClock(testStart)
	n := rapid.IntRange(1, 3).Draw(t, "controllers")
	logs := make([]*Log, n)
	for i := range logs {
		cfg := testConfig(root, fmt.Sprintf("ctl-%d", i))
		cfg.IndexEvery = rapid.IntRange(1, 6).Draw(t, "indexEvery")
		cfg.MaxSegmentBytes = int64(rapid.IntRange(4096, 12000).Draw(t, "maxSegmentBytes"))
		l, err := Open(cfg, Deps{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		logs[i] = l
	}
	defer func() {
		for _, l := range logs {
			l.Close()
		}
	}()
	times := []time.Time{testStart}
	ops := rapid.IntRange(0, 40).Draw(t, "ops")
	for i := range ops {
		switch rapid.IntRange(0, 9).Draw(t, "op") {
		case 0:
			clock.Advance(time.Hour) // every log rotates at its next append
		case 1, 2:
			clock.Advance(time.Duration(rapid.IntRange(0, 5000).Draw(t, "stepMs")) * time.Millisecond)
		default:
			l := logs[rapid.IntRange(0, n-1).Draw(t, "log")]
			e := Entry{
				Kind:       rapid.SampledFrom(propKinds).Draw(t, "kind"),
				DecisionID: fmt.Sprintf("d-%d", i),
				Tenant:     rapid.SampledFrom(propTenants).Draw(t, "tenant"),
				Origin:     rapid.SampledFrom(propRegions).Draw(t, "origin"),
				Region:     rapid.SampledFrom(propRegions).Draw(t, "region"),
				Rule:       "r", PolicyVersion: "1",
				Cost: []byte(`{"pad":"` + strings.Repeat("x", rapid.IntRange(0, 2000).Draw(t, "pad")) + `"}`),
			}
			if err := l.Append(context.Background(), e); err != nil {
				t.Fatal(err)
			}
		}
		times = append(times, clock.Now())
	}
	return times
}

func drawQuery(t *rapid.T, times []time.Time) Query {
	pick := func(label string) time.Time {
		if rapid.Bool().Draw(t, label+"Unbounded") {
			return time.Time{}
		}
		base := rapid.SampledFrom(times).Draw(t, label)
		return base.Add(time.Duration(rapid.IntRange(-1, 1).Draw(t, label+"Nudge")) * time.Millisecond)
	}
	q := Query{From: pick("from"), To: pick("to")}
	if !q.From.IsZero() && !q.To.IsZero() && !q.To.After(q.From) {
		q.To = time.Time{}
	}
	if rapid.Bool().Draw(t, "byRegion") {
		q.Region = rapid.SampledFrom(propRegions).Draw(t, "region")
	}
	if rapid.Bool().Draw(t, "byTenant") {
		q.Tenant = rapid.SampledFrom(propTenants).Draw(t, "tenant")
	}
	if rapid.Bool().Draw(t, "byKind") {
		q.Kinds = rapid.SliceOfNDistinct(rapid.SampledFrom(propKinds), 1, 2, func(k Kind) Kind { return k }).Draw(t, "kinds")
	}
	if rapid.IntRange(0, 3).Draw(t, "byController") == 0 {
		q.Controller = fmt.Sprintf("ctl-%d", rapid.IntRange(0, 2).Draw(t, "controller"))
	}
	if rapid.IntRange(0, 3).Draw(t, "limited") == 0 {
		q.Limit = rapid.IntRange(1, 10).Draw(t, "limit")
	}
	return q
}

// TestQueryMatchesNaive: the indexed, merged query returns exactly what a
// full scan, filter and sort returns.
func TestQueryMatchesNaive(t *testing.T) {
	h, _ := NewHasher(testKey)
	rapid.Check(t, func(t *rapid.T) {
		root, err := os.MkdirTemp("", "audit-prop-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(root)
		times := buildRandomLogs(t, root)
		src := &DirSource{Dir: root, Hasher: h}
		for range 5 {
			q := drawQuery(t, times)
			want, err := NaiveQuery(root, q, h)
			if err != nil {
				t.Fatal(err)
			}
			cur, err := src.Query(context.Background(), q)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Collect(cur)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(keys(got), keys(want)) {
				t.Fatalf("query %+v\n got %v\nwant %v", q, keys(got), keys(want))
			}
		}
	})
}

// TestQuerySeeksWithIndex shows the sparse index doing its job: records
// before the seek point are never read, so damage there does not disturb a
// later time range; without the index the same query reads (and trips on) it.
func TestQuerySeeksWithIndex(t *testing.T) {
	root := t.TempDir()
	clock := audittest.NewClock(testStart)
	cfg := testConfig(root, "c")
	cfg.IndexEvery = 4
	l := openTest(t, cfg, Deps{Clock: clock})
	for i := range 60 {
		if i == 30 {
			clock.Advance(time.Hour) // segment 2 starts at seq 31
		}
		clock.Advance(time.Second)
		mustAppend(t, l, testEntry(i))
	}
	l.Close()
	from := testStart.Add(time.Hour + 51*time.Second) // seq 51 onwards
	q := Query{From: from}
	want, _ := NaiveQuery(root, q, nil)
	if len(want) != 10 || want[0].Seq != 51 {
		t.Fatalf("naive: %v", keys(want))
	}
	// Damage seq 3 (sealed segment 1, skipped whole) and seq 40 (segment
	// 2, before the index entry of seq 47).
	for _, d := range []struct {
		seg  string
		line int
	}{{SegmentName(1), 2}, {SegmentName(31), 9}} {
		p := filepath.Join(l.Dir(), d.seg)
		ls := readLines(t, p)
		ls[d.line] = strings.Repeat("#", len(ls[d.line])) // same size: the seal still matches
		writeLines(t, p, ls)
	}
	src := &DirSource{Dir: root}
	cur, _ := src.Query(context.Background(), q)
	got, err := Collect(cur)
	if err != nil || !slices.Equal(keys(got), keys(want)) {
		t.Fatalf("indexed query: %v, %v", keys(got), err)
	}
	os.Remove(filepath.Join(l.Dir(), indexName(SegmentName(31))))
	cur, _ = src.Query(context.Background(), q)
	if _, err := Collect(cur); err == nil || !strings.Contains(err.Error(), "not a record") {
		t.Fatalf("query without the index should have read the damaged record: %v", err)
	}
}

func TestQueryErrors(t *testing.T) {
	src := &DirSource{Dir: t.TempDir()}
	if _, err := src.Query(context.Background(), Query{Tenant: "acme"}); !errors.Is(err, ErrNoKey) {
		t.Fatalf("tenant query without key: %v", err)
	}
	bad := []Query{
		{From: testStart, To: testStart},
		{Kinds: []Kind{"Not A Kind"}},
		{Controller: "a/b"},
		{Limit: -1},
	}
	for _, q := range bad {
		if _, err := src.Query(context.Background(), q); err == nil {
			t.Errorf("query %+v accepted", q)
		}
	}
	if _, err := (&DirSource{Dir: filepath.Join(t.TempDir(), "nope")}).Query(context.Background(), Query{}); err == nil {
		t.Error("query of a missing directory succeeded")
	}
}

func TestQueryValuesRoundTrip(t *testing.T) {
	q := Query{From: testStart, To: testStart.Add(time.Hour + time.Nanosecond), Region: "eu-west-1", Tenant: "acme",
		Kinds: []Kind{KindCrossRegion, KindResidencyDenied}, Controller: "c", Limit: 7}
	got, err := ParseQuery(q.Values())
	if err != nil || !got.From.Equal(q.From) || !got.To.Equal(q.To) || got.Region != q.Region || got.Tenant != q.Tenant ||
		!slices.Equal(got.Kinds, q.Kinds) || got.Controller != q.Controller || got.Limit != q.Limit {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for param, val := range map[string]string{"from": "yesterday", "to": "12:00", "limit": "many", "kind": "BAD"} {
		if _, err := ParseQuery(url.Values{param: {val}}); err == nil || !strings.Contains(err.Error(), strings.ToLower(param)) && !strings.Contains(err.Error(), val) {
			t.Errorf("%s=%s: %v", param, val, err)
		}
	}
}

func TestLogTailFollowsCommitsAndRotation(t *testing.T) {
	root := t.TempDir()
	clock := audittest.NewClock(testStart)
	cfg := testConfig(root, "c")
	l := openTest(t, cfg, Deps{Clock: clock})
	mustAppend(t, l, testEntry(0)) // before the tail: not seen
	cur, err := l.Tail(context.Background(), Query{Kinds: []Kind{KindCrossRegion, KindForwardedIn}})
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	got := make(chan Record)
	done := make(chan error, 1)
	go func() {
		for {
			r, err := cur.Next()
			if err != nil {
				done <- err
				return
			}
			got <- r
		}
	}()
	for i := 1; i <= 6; i++ {
		if i == 4 {
			clock.Advance(cfg.MaxSegmentAge)
		}
		mustAppend(t, l, testEntry(i)) // kinds cycle: 1 denied, 2 forwarded, 3 cross, ...
	}
	var seqs []uint64
	for range 4 {
		seqs = append(seqs, recv(t, got).Seq)
	}
	if !slices.Equal(seqs, []uint64{3, 4, 6, 7}) {
		t.Fatalf("tail returned seqs %v", seqs)
	}
	l.Close()
	if err := recv(t, done); err != io.EOF {
		t.Fatalf("tail after close: %v", err)
	}
}

func TestDirTailPollsAllControllers(t *testing.T) {
	root := t.TempDir()
	a := openTest(t, testConfig(root, "a"), Deps{})
	mustAppend(t, a, testEntry(0))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := &DirSource{Dir: root, PollInterval: time.Millisecond}
	cur, err := src.Tail(ctx, Query{})
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, a, testEntry(1))
	b := openTest(t, testConfig(root, "b"), Deps{}) // appears after the tail started: read from its start
	mustAppend(t, b, testEntry(2))
	mustAppend(t, b, testEntry(3))
	var got []string
	for len(got) < 3 {
		r, err := cur.Next()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s#%d", r.Controller, r.Seq))
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"a#2", "b#1", "b#2"}) {
		t.Fatalf("tail got %v", got)
	}
	cancel()
	if _, err := cur.Next(); !errors.Is(err, context.Canceled) {
		t.Fatalf("tail after cancel: %v", err)
	}
}
