package audit

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
)

// ProblemKind classifies what Verify found wrong.
type ProblemKind string

// Problem kinds. Each names the segment and, for records, the line.
const (
	ProblemMalformed      ProblemKind = "malformed"           // a line that is not a record (edited beyond parsing)
	ProblemEdited         ProblemKind = "edited"              // a record whose content does not match its hash, or is not canonical
	ProblemRewritten      ProblemKind = "rewritten"           // a record re-hashed after an edit: its successor chained to another hash
	ProblemInserted       ProblemKind = "inserted"            // a record that does not belong in the chain (duplicate, out of range, forged)
	ProblemDeleted        ProblemKind = "deleted"             // records missing from the chain
	ProblemReordered      ProblemKind = "reordered"           // a record of the chain found out of its place
	ProblemTimeOrder      ProblemKind = "time_order"          // a record older than its predecessor
	ProblemForeign        ProblemKind = "foreign"             // a record of another controller
	ProblemTorn           ProblemKind = "torn"                // an incomplete last line
	ProblemTruncated      ProblemKind = "truncated"           // records cut from the end of a segment
	ProblemSegmentMissing ProblemKind = "segment_missing"     // a whole segment deleted
	ProblemSegmentSwapped ProblemKind = "segment_swapped"     // a segment under another segment's name, or another chain's segment
	ProblemCheckpoint     ProblemKind = "checkpoint_mismatch" // the chain disagrees with a checkpoint
	ProblemUnreadable     ProblemKind = "unreadable"          // a segment that could not be read
)

// Problem is one finding of Verify. Line is the 1-based line of the segment
// file (for missing records: where they would be); Seq..SeqEnd the records.
type Problem struct {
	Kind       ProblemKind `json:"kind"`
	Controller string      `json:"controller"`
	Segment    string      `json:"segment,omitempty"`
	Line       int         `json:"line,omitempty"`
	Seq        uint64      `json:"seq,omitempty"`
	SeqEnd     uint64      `json:"seq_end,omitempty"`
	Detail     string      `json:"detail"`
}

func (p Problem) String() string {
	loc := p.Controller
	if p.Segment != "" {
		loc += "/" + p.Segment
	}
	if p.Line > 0 {
		loc += fmt.Sprintf(" line %d", p.Line)
	}
	switch {
	case p.SeqEnd > p.Seq:
		loc += fmt.Sprintf(" (seq %d..%d)", p.Seq, p.SeqEnd)
	case p.Seq > 0:
		loc += fmt.Sprintf(" (seq %d)", p.Seq)
	}
	return fmt.Sprintf("%s: %s: %s", p.Kind, loc, p.Detail)
}

// ChainSummary describes one controller's chain as Verify read it.
type ChainSummary struct {
	Controller  string `json:"controller"`
	Segments    int    `json:"segments"`
	Records     uint64 `json:"records"`
	FirstSeq    uint64 `json:"first_seq"`
	LastSeq     uint64 `json:"last_seq"`
	Head        string `json:"head"`
	Checkpoints int    `json:"checkpoints"`        // checkpoints of this controller checked
	Anchored    uint64 `json:"anchored_through"`   // highest seq a checkpoint confirmed
	Unanchored  uint64 `json:"unanchored_records"` // records after it: their truncation is undetectable
}

// Report is the result of Verify.
type Report struct {
	Chains   []ChainSummary `json:"chains"`
	Problems []Problem      `json:"problems"`
}

// OK reports whether Verify found nothing wrong.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

// WriteText writes the report for a person.
func (r *Report) WriteText(w io.Writer) error {
	for _, c := range r.Chains {
		head := c.Head
		if len(head) > 16 {
			head = head[:16]
		}
		if _, err := fmt.Fprintf(w, "controller %s: %d segments, %d records, seq %d..%d, head %s, %d checkpoints, anchored through seq %d\n",
			c.Controller, c.Segments, c.Records, c.FirstSeq, c.LastSeq, head, c.Checkpoints, c.Anchored); err != nil {
			return err
		}
	}
	for _, p := range r.Problems {
		if _, err := fmt.Fprintf(w, "PROBLEM %s\n", p); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "%d problems\n", len(r.Problems))
	return err
}

// Verify recomputes every chain under dir (an audit root holding one
// directory per controller, or one controller's directory) and checks it
// against checkpoints. It reports each edit, deletion, insertion, reorder,
// truncation, missing or swapped segment with its segment file and line. The
// error is only for a dir that cannot be read; problems go in the Report.
//
// Without a checkpoint covering them, records cut from the end of the last
// segment cannot be told from records never written; and a chain rewritten
// and re-hashed from some record to its end is only caught by a checkpoint.
// On a directory a log is writing to, a batch caught mid-write shows as a
// torn last line.
func Verify(dir string, checkpoints []Checkpoint) (*Report, error) {
	chains, err := listChains(dir)
	if err != nil {
		return nil, fmt.Errorf("verify %s: %w", dir, err)
	}
	rootLayout := true
	if len(chains) == 1 && filepath.Clean(chains[0].dir) == filepath.Clean(dir) {
		rootLayout = false
	}
	byController := map[string][]Checkpoint{}
	for _, cp := range checkpoints {
		byController[cp.Controller] = append(byController[cp.Controller], cp)
	}
	rep := &Report{}
	seen := map[string]bool{}
	for _, cd := range chains {
		seen[cd.controller] = true
		v := &chainVerifier{controller: cd.controller, dir: cd.dir, rep: rep, cps: byController[cd.controller]}
		if err := v.run(); err != nil {
			return nil, fmt.Errorf("verify %s: %w", cd.dir, err)
		}
	}
	if rootLayout {
		var missing []string
		for c := range byController {
			if !seen[c] {
				missing = append(missing, c)
			}
		}
		slices.Sort(missing)
		for _, c := range missing {
			v := &chainVerifier{controller: c, dir: filepath.Join(dir, c), rep: rep, cps: byController[c]}
			v.summary.Controller = c
			v.prepareCheckpoints()
			v.checkRemainingCheckpoints()
			rep.Chains = append(rep.Chains, v.summary)
		}
	}
	return rep, nil
}
