package audit

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/meridian-llm/meridian/global/audit/audittest"
)

// fixture is a closed log of one controller with three segments of ten
// records each (seq 1-10, 11-20, 21-30) and a checkpoint at the end of each.
type fixture struct {
	root, dir string
	cps       []Checkpoint
	seg       [3]string // paths
}

func newFixture(t testing.TB, controller string) fixture {
	t.Helper()
	root := t.TempDir()
	clock := audittest.NewClock(testStart)
	cfg := testConfig(root, controller)
	cfg.IndexEvery = 4
	l := openTest(t, cfg, Deps{Clock: clock})
	var f fixture
	f.root, f.dir = root, l.Dir()
	for s := range 3 {
		for i := range 10 {
			clock.Advance(1e6)
			mustAppend(t, l, testEntry(s*10+i))
		}
		f.cps = append(f.cps, l.Checkpoint())
		clock.Advance(cfg.MaxSegmentAge) // the next append starts a segment
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for s := range 3 {
		f.seg[s] = filepath.Join(f.dir, SegmentName(uint64(s*10+1)))
	}
	return f
}

func (f fixture) lines(t testing.TB, seg int) []string { return readLines(t, f.seg[seg]) }

func (f fixture) write(t testing.TB, seg int, lines []string) { writeLines(t, f.seg[seg], lines) }

func parseLine(t testing.TB, line string) Record {
	t.Helper()
	var r Record
	if err := decodeRecord([]byte(line), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// encode re-encodes r with a correct hash of its (possibly edited) content.
func encode(t testing.TB, r Record) string {
	t.Helper()
	r.Hash = strings.Repeat("0", 2*sha256.Size)
	b, err := r.AppendCanonical(nil)
	if err != nil {
		t.Fatal(err)
	}
	open := b[:len(b)-len(`,"hash":""}`)-2*sha256.Size]
	r.Hash = contentHash(open)
	b, _ = r.AppendCanonical(nil)
	return string(b)
}

type want struct {
	kind    ProblemKind
	segment string
	line    int
	seq     uint64
}

func (w want) String() string {
	return fmt.Sprintf("%s %s line %d seq %d", w.kind, w.segment, w.line, w.seq)
}

func seg(n uint64) string { return SegmentName(n) }

// TestVerifyDetectsEachTampering applies one kind of tampering per case
// and checks that Verify reports exactly it: kind, segment, line and seq.
func TestVerifyDetectsEachTampering(t *testing.T) {
	cases := []struct {
		name   string
		tamper func(t *testing.T, f fixture)
		noCps  bool // verify without checkpoints
		want   []want
	}{
		{"untouched", func(t *testing.T, f fixture) {}, false, nil},
		{"edit a field", func(t *testing.T, f fixture) {
			ls := f.lines(t, 1)
			ls[4] = strings.Replace(ls[4], `"region":"us-west-2"`, `"region":"eu-west-1"`, 1)
			f.write(t, 1, ls)
		}, false, []want{{ProblemEdited, seg(11), 5, 15}}},
		{"edit the cost explanation", func(t *testing.T, f fixture) {
			ls := f.lines(t, 0)
			ls[2] = strings.Replace(ls[2], `"margin_ms":2.5`, `"margin_ms":250`, 1)
			f.write(t, 0, ls)
		}, false, []want{{ProblemEdited, seg(1), 3, 3}}},
		{"edit the seq", func(t *testing.T, f fixture) {
			ls := f.lines(t, 1)
			ls[4] = strings.Replace(ls[4], `"seq":15`, `"seq":16`, 1)
			f.write(t, 1, ls)
		}, false, []want{{ProblemEdited, seg(11), 5, 16}}},
		{"edit and re-hash one record", func(t *testing.T, f fixture) {
			ls := f.lines(t, 1)
			r := parseLine(t, ls[4])
			r.Pod = "pod-forged"
			ls[4] = encode(t, r)
			f.write(t, 1, ls)
		}, false, []want{{ProblemRewritten, seg(11), 5, 15}}},
		{"edit and re-hash the rest of the chain", func(t *testing.T, f fixture) {
			prev := ""
			for s := 1; s < 3; s++ {
				ls := f.lines(t, s)
				for i := range ls {
					r := parseLine(t, ls[i])
					if r.Seq == 15 {
						r.Pod = "pod-forged"
					}
					if r.Seq > 15 {
						r.Prev = prev
					}
					ls[i] = encode(t, r)
					prev = parseLine(t, ls[i]).Hash
				}
				f.write(t, s, ls)
			}
			os.Remove(filepath.Join(f.dir, indexName(seg(21)))) // the seal would give it away too
		}, false, []want{{ProblemCheckpoint, seg(11), 10, 11}, {ProblemCheckpoint, seg(21), 10, 11}}},
		{"garble a record", func(t *testing.T, f fixture) {
			ls := f.lines(t, 1)
			ls[4] = ls[4][:40] + "#" + ls[4][41:]
			f.write(t, 1, ls)
		}, false, []want{{ProblemMalformed, seg(11), 5, 0}}},
		{"delete a record", func(t *testing.T, f fixture) {
			ls := f.lines(t, 1)
			f.write(t, 1, slices.Delete(ls, 4, 5))
		}, false, []want{{ProblemDeleted, seg(11), 5, 15}}},
		{"delete the first record of a segment", func(t *testing.T, f fixture) {
			ls := f.lines(t, 1)
			f.write(t, 1, ls[1:])
		}, false, []want{{ProblemDeleted, seg(11), 1, 11}}},
		{"delete the last record of a middle segment", func(t *testing.T, f fixture) {
			ls := f.lines(t, 0)
			f.write(t, 0, ls[:9])
		}, false, []want{{ProblemTruncated, seg(1), 10, 10}}},
		{"insert a copy of a record", func(t *testing.T, f fixture) {
			ls := f.lines(t, 1)
			f.write(t, 1, slices.Insert(ls, 4, ls[3]))
		}, false, []want{{ProblemInserted, seg(11), 5, 14}}},
		{"insert a forged record", func(t *testing.T, f fixture) {
			ls := f.lines(t, 1)
			r := parseLine(t, ls[4]) // seq 15, chained to 14
			r.Region, r.Pod = "ap-southeast-1", "pod-x"
			f.write(t, 1, slices.Insert(ls, 4, encode(t, r)))
		}, false, []want{{ProblemInserted, seg(11), 5, 15}}},
		{"insert another controller's record", func(t *testing.T, f fixture) {
			other := newFixture(t, "eu-west-1-a")
			ls := f.lines(t, 1)
			f.write(t, 1, slices.Insert(ls, 6, other.lines(t, 1)[6]))
		}, false, []want{{ProblemForeign, seg(11), 7, 17}}},
		{"move a record later", func(t *testing.T, f fixture) {
			ls := f.lines(t, 1)
			moved := ls[2]
			ls = slices.Delete(ls, 2, 3)
			f.write(t, 1, slices.Insert(ls, 7, moved))
		}, false, []want{{ProblemReordered, seg(11), 8, 13}}},
		{"move a record to the top", func(t *testing.T, f fixture) {
			ls := f.lines(t, 2)
			last := ls[9]
			f.write(t, 2, append([]string{last}, ls[:9]...))
		}, false, []want{{ProblemReordered, seg(21), 1, 30}}},
		{"swap two records", func(t *testing.T, f fixture) {
			ls := f.lines(t, 1)
			ls[4], ls[5] = ls[5], ls[4]
			f.write(t, 1, ls)
		}, false, []want{{ProblemReordered, seg(11), 5, 16}}},
		{"truncate the tail (caught by the checkpoint)", func(t *testing.T, f fixture) {
			ls := f.lines(t, 2)
			f.write(t, 2, ls[:7])
			os.Remove(filepath.Join(f.dir, indexName(seg(21))))
		}, false, []want{{ProblemTruncated, seg(21), 8, 28}}},
		{"truncate the tail (caught by the seal)", func(t *testing.T, f fixture) {
			ls := f.lines(t, 2)
			f.write(t, 2, ls[:7])
		}, true, []want{{ProblemTruncated, seg(21), 8, 28}}},
		{"truncate inside a record", func(t *testing.T, f fixture) {
			b, _ := os.ReadFile(f.seg[2])
			ls := f.lines(t, 2)
			cut := len(strings.Join(ls[:7], "\n")) + 1 + 100
			os.WriteFile(f.seg[2], b[:cut], 0o640)
			os.Remove(filepath.Join(f.dir, indexName(seg(21))))
		}, false, []want{{ProblemTorn, seg(21), 8, 0}, {ProblemTruncated, seg(21), 8, 28}}},
		{"delete a middle segment", func(t *testing.T, f fixture) {
			os.Remove(f.seg[1])
		}, false, []want{{ProblemSegmentMissing, seg(11), 0, 11}}},
		{"delete the first segment", func(t *testing.T, f fixture) {
			os.Remove(f.seg[0])
		}, false, []want{{ProblemSegmentMissing, seg(1), 0, 1}}},
		{"delete the last segment", func(t *testing.T, f fixture) {
			os.Remove(f.seg[2])
		}, false, []want{{ProblemSegmentMissing, seg(21), 0, 21}}},
		{"swap two segments", func(t *testing.T, f fixture) {
			a, b := f.lines(t, 0), f.lines(t, 1)
			f.write(t, 0, b)
			f.write(t, 1, a)
		}, false, []want{{ProblemSegmentSwapped, seg(1), 0, 11}, {ProblemSegmentSwapped, seg(11), 0, 1}}},
		{"replace a segment with another controller's", func(t *testing.T, f fixture) {
			other := newFixture(t, "eu-west-1-a")
			f.write(t, 1, other.lines(t, 1))
		}, false, []want{{ProblemSegmentSwapped, seg(11), 0, 11}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "us-east-1-a")
			tc.tamper(t, f)
			cps := f.cps
			if tc.noCps {
				cps = nil
			}
			rep, err := Verify(f.root, cps)
			if err != nil {
				t.Fatal(err)
			}
			var got []want
			for _, p := range rep.Problems {
				got = append(got, want{p.Kind, p.Segment, p.Line, p.Seq})
				if p.Controller != "us-east-1-a" || p.Detail == "" {
					t.Errorf("problem without controller or detail: %+v", p)
				}
			}
			if !slices.Equal(got, tc.want) {
				for _, p := range rep.Problems {
					t.Logf("reported: %s", p)
				}
				t.Fatalf("problems\n got %v\nwant %v", got, tc.want)
			}
		})
	}
}

// Without a checkpoint (and without the seal, as in a log that crashed),
// cutting the tail of the last segment cannot be told from records that
// were never written: the documented limit, which checkpoints close.
func TestVerifyTailCutWithoutAnchorIsUndetectable(t *testing.T) {
	f := newFixture(t, "c")
	f.write(t, 2, f.lines(t, 2)[:7])
	os.Remove(filepath.Join(f.dir, indexName(seg(21))))
	rep := verifyOK(t, f.root, nil)
	if c := rep.Chains[0]; c.LastSeq != 27 || c.Anchored != 0 || c.Unanchored != 27 {
		t.Fatalf("summary %+v", c)
	}
	if rep, _ := Verify(f.root, f.cps); rep.OK() {
		t.Fatal("the checkpoint did not catch the cut tail")
	}
}

func TestVerifyMissingControllerAndMisplacedCheckpoint(t *testing.T) {
	f := newFixture(t, "c")
	ghost := Checkpoint{Controller: "gone", Segment: seg(1), LastSeq: 4, Head: strings.Repeat("a", 64), Count: 4}
	wrongSeg := f.cps[0]
	wrongSeg.Segment = seg(11)
	rep, err := Verify(f.root, []Checkpoint{ghost, wrongSeg, f.cps[2]})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range rep.Problems {
		got = append(got, fmt.Sprintf("%s %s %s %d", p.Controller, p.Kind, p.Segment, p.Seq))
	}
	wantP := []string{"c checkpoint_mismatch " + seg(1) + " 10", "gone segment_missing " + seg(1) + " 1"}
	if !slices.Equal(got, wantP) {
		t.Fatalf("got %q\nwant %q", got, wantP)
	}
}

// TestVerifyAnyByteEditDetected: flipping any byte of any segment is
// reported (the index files are advisory and are not part of the proof).
func TestVerifyAnyByteEditDetected(t *testing.T) {
	f := newFixture(t, "c")
	orig := make([][]byte, 3)
	for i := range 3 {
		orig[i], _ = os.ReadFile(f.seg[i])
	}
	rapid.Check(t, func(rt *rapid.T) {
		s := rapid.IntRange(0, 2).Draw(rt, "segment")
		b := slices.Clone(orig[s])
		i := rapid.IntRange(0, len(b)-1).Draw(rt, "byte")
		c := byte(rapid.IntRange(0, 255).Draw(rt, "value"))
		if b[i] == c {
			rt.Skip("no change")
		}
		b[i] = c
		os.WriteFile(f.seg[s], b, 0o640)
		defer os.WriteFile(f.seg[s], orig[s], 0o640)
		rep, err := Verify(f.root, f.cps)
		if err != nil {
			rt.Fatal(err)
		}
		if rep.OK() {
			rt.Fatalf("byte %d of segment %d set to %q: not detected", i, s, c)
		}
		line := 1 + strings.Count(string(orig[s][:i]), "\n")
		for _, p := range rep.Problems {
			if p.Segment == filepath.Base(f.seg[s]) && (p.Line == line || p.Line == line+1 || p.Line == 0) {
				return
			}
		}
		rt.Fatalf("byte %d (line %d) of %s edited; reported elsewhere: %v", i, line, filepath.Base(f.seg[s]), rep.Problems)
	})
}

func TestReadCheckpoints(t *testing.T) {
	f := newFixture(t, "c")
	path := filepath.Join(t.TempDir(), "cps.jsonl")
	sink := &FileSink{Path: path}
	for _, cp := range f.cps {
		if err := sink.PublishCheckpoint(t.Context(), cp); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ReadCheckpointsFile(path)
	if err != nil || len(got) != 3 || got[2].Head != f.cps[2].Head || !got[2].Time.Equal(f.cps[2].Time) {
		t.Fatalf("read back %+v, %v", got, err)
	}
	bad := []string{`{"controller":"c"}`, `not json`}
	for _, b := range bad {
		if _, err := ReadCheckpoints(strings.NewReader("\n" + b + "\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%q: %v", b, err)
		}
	}
}
