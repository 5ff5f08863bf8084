package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// naiveHunks is the reference grouping: a line of the diff is shown when a
// change is at most context lines away; each run of shown lines is a hunk.
func naiveHunks(lines []diffLine, context int) [][]diffLine {
	shown := make([]bool, len(lines))
	for i, l := range lines {
		if l.Op == " " {
			continue
		}
		for j := max(0, i-context); j <= min(len(lines)-1, i+context); j++ {
			shown[j] = true
		}
	}
	var out [][]diffLine
	for i := 0; i < len(lines); {
		if !shown[i] {
			i++
			continue
		}
		j := i
		for j < len(lines) && shown[j] {
			j++
		}
		out = append(out, lines[i:j])
		i = j
	}
	return out
}

// applyHunks is a naive patch: it rebuilds the new side from the old one
// and the hunks, checking each hunk's header and context against the old
// side.
func applyHunks(a []string, hunks []hunk) ([]string, error) {
	var out []string
	next := 0 // index in a of the next line not yet copied
	for _, h := range hunks {
		start := h.OldStart - 1
		if h.OldLines == 0 {
			start = h.OldStart // diff -u names the line before an insertion
		}
		if start < next || start > len(a) {
			return nil, fmt.Errorf("hunk at old line %d overlaps or is out of range", h.OldStart)
		}
		if got := len(out) + start - next + 1; h.NewLines > 0 && got != h.NewStart {
			return nil, fmt.Errorf("hunk says new line %d, it is line %d", h.NewStart, got)
		}
		out = append(out, a[next:start]...)
		i := start
		oldN, newN := 0, 0
		for _, l := range h.Lines {
			switch l.Op {
			case " ", "-":
				if i >= len(a) || a[i] != l.Text {
					return nil, fmt.Errorf("hunk line %q does not match old line %d", l.Text, i+1)
				}
				if l.Op == " " {
					out = append(out, l.Text)
					newN++
				}
				i++
				oldN++
			case "+":
				out = append(out, l.Text)
				newN++
			}
		}
		if oldN != h.OldLines || newN != h.NewLines {
			return nil, fmt.Errorf("hunk header -%d,%d +%d,%d counts -%d +%d", h.OldStart, h.OldLines, h.NewStart, h.NewLines, oldN, newN)
		}
		next = i
	}
	return append(out, a[next:]...), nil
}

// TestUnifiedHunksProperties: the hunks, applied to the old side, rebuild
// the new side with headers that count their lines; they show exactly the
// lines the naive grouping shows; no change, no hunk.
func TestUnifiedHunksProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		gen := rapid.SliceOfN(rapid.SampledFrom([]string{"a", "b", "c", "d", "zones:", ""}), 0, 40)
		a, b := gen.Draw(rt, "a"), gen.Draw(rt, "b")
		context := rapid.IntRange(0, 4).Draw(rt, "context")
		lines := diffLines(a, b)
		hunks := unifiedHunks(lines, context)
		got, err := applyHunks(a, hunks)
		if err != nil {
			rt.Fatalf("%v\n%s", err, render(a, hunks))
		}
		if !slices.Equal(got, b) && !(len(got) == 0 && len(b) == 0) {
			rt.Fatalf("the hunks rebuild %q, want %q\n%s", got, b, render(a, hunks))
		}
		want := naiveHunks(lines, context)
		if len(want) != len(hunks) {
			rt.Fatalf("%d hunks, the naive grouping has %d\n%s", len(hunks), len(want), render(a, hunks))
		}
		for i := range want {
			if !slices.Equal(want[i], hunks[i].Lines) {
				rt.Fatalf("hunk %d shows %v, the naive grouping %v", i, hunks[i].Lines, want[i])
			}
		}
		if slices.Equal(a, b) != (len(hunks) == 0) {
			rt.Fatalf("equal inputs %v, %d hunks", slices.Equal(a, b), len(hunks))
		}
	})
}

func render(a []string, hunks []hunk) string {
	var buf bytes.Buffer
	_ = writeUnified(&buf, "old", "new", hunks)
	return fmt.Sprintf("old: %q\n%s", a, buf.String())
}

// TestUnifiedOutput: one changed line in the middle of a long file is one
// hunk with three lines of context each side, headed as diff -u heads it;
// an insertion at the top names line 0; two files that differ through
// and through past the table's bound still diff correctly.
func TestUnifiedOutput(t *testing.T) {
	var a []string
	for i := 1; i <= 20; i++ {
		a = append(a, fmt.Sprintf("line %d", i))
	}
	b := slices.Clone(a)
	b[9] = "line ten"
	var buf bytes.Buffer
	if err := writeUnified(&buf, "a", "b", unifiedHunks(diffLines(a, b), 3)); err != nil {
		t.Fatal(err)
	}
	want := "--- a\n+++ b\n@@ -7,7 +7,7 @@\n line 7\n line 8\n line 9\n-line 10\n+line ten\n line 11\n line 12\n line 13\n"
	if buf.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", buf.String(), want)
	}
	buf.Reset()
	_ = writeUnified(&buf, "a", "b", unifiedHunks(diffLines(nil, []string{"x"}), 3))
	if want := "--- a\n+++ b\n@@ -0,0 +1 @@\n+x\n"; buf.String() != want {
		t.Fatalf("insertion into an empty file: got\n%s", buf.String())
	}
	// Past maxLCSCells: the middle is replaced whole; the hunks still
	// rebuild the new side.
	var big1, big2 []string
	for i := range 2100 {
		big1, big2 = append(big1, fmt.Sprint("x", i)), append(big2, fmt.Sprint("y", i))
	}
	big1, big2 = append([]string{"same"}, append(big1, "same")...), append([]string{"same"}, append(big2, "same")...)
	hunks := unifiedHunks(diffLines(big1, big2), 3)
	got, err := applyHunks(big1, hunks)
	if err != nil || !slices.Equal(got, big2) || len(hunks) != 1 {
		t.Fatalf("large diff: %d hunks, %v", len(hunks), err)
	}
	if strings.Count(fmt.Sprint(hunks[0].Lines), "same") != 2 {
		t.Fatal("the common head and tail are not kept as context")
	}
}

// lcsNaive is the reference: the length of the longest common subsequence by
// plain recursion (tiny inputs only).
func lcsNaive(a, b []string) int {
	if len(a) == 0 || len(b) == 0 {
		return 0
	}
	if a[0] == b[0] {
		return 1 + lcsNaive(a[1:], b[1:])
	}
	return max(lcsNaive(a[1:], b), lcsNaive(a, b[1:]))
}

// TestDiffLinesProperties: the diff rebuilds both sides and keeps a longest
// common subsequence, as the naive recursion computes it.
func TestDiffLinesProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		gen := rapid.SliceOfN(rapid.SampledFrom([]string{"a", "b", "c", "zones:", ""}), 0, 8)
		a, b := gen.Draw(rt, "a"), gen.Draw(rt, "b")
		var gotA, gotB []string
		common := 0
		for _, l := range diffLines(a, b) {
			switch l.Op {
			case " ":
				gotA, gotB = append(gotA, l.Text), append(gotB, l.Text)
				common++
			case "-":
				gotA = append(gotA, l.Text)
			case "+":
				gotB = append(gotB, l.Text)
			default:
				rt.Fatalf("op %q", l.Op)
			}
		}
		if strings.Join(gotA, "\n") != strings.Join(a, "\n") || len(gotA) != len(a) || strings.Join(gotB, "\n") != strings.Join(b, "\n") || len(gotB) != len(b) {
			rt.Fatalf("diff does not rebuild the inputs: %q %q", gotA, gotB)
		}
		if want := lcsNaive(a, b); common != want {
			rt.Fatalf("kept %d common lines, the longest common subsequence has %d", common, want)
		}
	})
}
