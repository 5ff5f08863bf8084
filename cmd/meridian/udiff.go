package main

import (
	"fmt"
	"io"
	"strings"
)

// diffLine is one line of a line diff.
type diffLine struct {
	Op   string `json:"op"` // " " (in both), "-" (only in the old side), "+" (only in the new side)
	Text string `json:"text"`
}

// maxLCSCells bounds the quadratic table of diffLines: beyond it (two
// files of thousands of lines that differ all through), the part between
// the common head and tail is shown as replaced whole, still a correct
// diff but not a minimal one.
const maxLCSCells = 4 << 20

// diffLines is a line diff of a and b that keeps a longest common
// subsequence: the common head and tail are matched first, then a
// longest-common-subsequence table (quadratic) aligns the rest.
func diffLines(a, b []string) []diffLine {
	head := 0
	for head < len(a) && head < len(b) && a[head] == b[head] {
		head++
	}
	tail := 0
	for tail < len(a)-head && tail < len(b)-head && a[len(a)-1-tail] == b[len(b)-1-tail] {
		tail++
	}
	out := make([]diffLine, 0, max(len(a), len(b))+8)
	for _, l := range a[:head] {
		out = append(out, diffLine{" ", l})
	}
	out = append(out, lcsDiff(a[head:len(a)-tail], b[head:len(b)-tail])...)
	for _, l := range a[len(a)-tail:] {
		out = append(out, diffLine{" ", l})
	}
	return out
}

// lcsDiff aligns a and b by a longest common subsequence (dynamic
// programming), or, past maxLCSCells, replaces a with b whole.
func lcsDiff(a, b []string) []diffLine {
	n, m := len(a), len(b)
	var out []diffLine
	if (n+1)*(m+1) > maxLCSCells {
		for _, l := range a {
			out = append(out, diffLine{"-", l})
		}
		for _, l := range b {
			out = append(out, diffLine{"+", l})
		}
		return out
	}
	w := m + 1
	lcs := make([]int32, (n+1)*w) // lcs[i*w+j]: LCS of a[i:] and b[j:]
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i*w+j] = lcs[(i+1)*w+j+1] + 1
			} else {
				lcs[i*w+j] = max(lcs[(i+1)*w+j], lcs[i*w+j+1])
			}
		}
	}
	i, j := 0, 0
	for i < n && j < m {
		switch {
		case a[i] == b[j]:
			out = append(out, diffLine{" ", a[i]})
			i++
			j++
		case lcs[(i+1)*w+j] >= lcs[i*w+j+1]:
			out = append(out, diffLine{"-", a[i]})
			i++
		default:
			out = append(out, diffLine{"+", b[j]})
			j++
		}
	}
	for ; i < n; i++ {
		out = append(out, diffLine{"-", a[i]})
	}
	for ; j < m; j++ {
		out = append(out, diffLine{"+", b[j]})
	}
	return out
}

// hunk is one hunk of a unified diff: lines OldStart.. of the old side
// (OldLines of them) and NewStart.. of the new side, 1-based (0 with no
// lines, as diff -u writes it).
type hunk struct {
	OldStart int        `json:"old_start"`
	OldLines int        `json:"old_lines"`
	NewStart int        `json:"new_start"`
	NewLines int        `json:"new_lines"`
	Lines    []diffLine `json:"lines"`
}

// unifiedHunks groups a line diff into hunks with up to context unchanged
// lines before and after each change; changes closer than 2*context lines
// share a hunk. No change: no hunk.
func unifiedHunks(lines []diffLine, context int) []hunk {
	context = max(context, 0)
	var hunks []hunk
	oldLine, newLine := 1, 1 // line numbers of lines[k] on each side
	k := 0
	for k < len(lines) {
		if lines[k].Op == " " {
			k, oldLine, newLine = k+1, oldLine+1, newLine+1
			continue
		}
		// A change at k: the hunk starts context lines before it.
		start := k
		for start > 0 && k-start < context && lines[start-1].Op == " " {
			start--
		}
		h := hunk{OldStart: oldLine - (k - start), NewStart: newLine - (k - start)}
		end := k // one past the last change of the hunk
		for j := k; j < len(lines); j++ {
			if lines[j].Op != " " {
				end = j + 1
				continue
			}
			if j-end >= 2*context {
				break
			}
		}
		stop := min(end+context, len(lines))
		for j := end; j < stop; j++ {
			if lines[j].Op != " " {
				stop = j
				break
			}
		}
		h.Lines = lines[start:stop]
		for _, l := range h.Lines {
			if l.Op != "+" {
				h.OldLines++
			}
			if l.Op != "-" {
				h.NewLines++
			}
		}
		if h.OldLines == 0 {
			h.OldStart-- // diff -u: the line before an insertion
		}
		if h.NewLines == 0 {
			h.NewStart--
		}
		hunks = append(hunks, h)
		for j := k; j < stop; j++ {
			if lines[j].Op != "+" {
				oldLine++
			}
			if lines[j].Op != "-" {
				newLine++
			}
		}
		k = stop
	}
	return hunks
}

// writeUnified writes hunks as diff -u does, after the --- and +++ lines.
func writeUnified(w io.Writer, oldName, newName string, hunks []hunk) error {
	var b strings.Builder
	fmt.Fprintf(&b, "--- %s\n+++ %s\n", oldName, newName)
	for _, h := range hunks {
		fmt.Fprintf(&b, "@@ -%s +%s @@\n", hunkRange(h.OldStart, h.OldLines), hunkRange(h.NewStart, h.NewLines))
		for _, l := range h.Lines {
			b.WriteString(l.Op)
			b.WriteString(l.Text)
			b.WriteByte('\n')
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func hunkRange(start, n int) string {
	if n == 1 {
		return fmt.Sprint(start)
	}
	return fmt.Sprintf("%d,%d", start, n)
}

// splitLines splits a document into lines (a final newline ends the last
// line rather than starting an empty one).
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}
