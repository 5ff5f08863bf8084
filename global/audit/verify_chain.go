package audit

import (
	"cmp"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sort"
	"time"
)

// vline is one line of a segment as Verify sees it.
type vline struct {
	line       int
	parsed     bool
	hashOK     bool
	problem    string
	seq        uint64
	ts         time.Time
	controller string
	prev, hash string
	role       lineRole
}

type lineRole uint8

const (
	roleNone      lineRole = iota
	roleChain              // in its place in the chain
	roleReordered          // in the chain, out of its place
	roleInserted           // not part of the chain
	roleSuspect            // edited record that is also misplaced: counted as a damaged line
)

type vseg struct {
	name     string
	nameSeq  uint64
	lines    []vline
	torn     []byte
	tornLine int
	median   uint64
	foreign  string // set when every record belongs to this other controller
	readErr  error
}

type chainVerifier struct {
	controller string
	dir        string
	rep        *Report
	cps        []Checkpoint
	ci         int // next checkpoint to check (cps sorted by LastSeq)
	summary    ChainSummary

	segNames map[string]bool
	lastSeq  uint64
	lastHash string
	lastTS   time.Time
	lastSeg  *vseg
	lastLine int
	lastBad  bool // the last chain record was reported as edited
	lastGood uint64
	// explained are seq ranges already accounted for by a segment-level
	// problem (a foreign segment in their place).
	explained [][2]uint64
	misnamed  map[string]bool

	firstProblem int // index of this chain's first problem in rep.Problems
}

func (v *chainVerifier) add(p Problem) {
	p.Controller = v.controller
	v.rep.Problems = append(v.rep.Problems, p)
}

func (v *chainVerifier) prepareCheckpoints() {
	slices.SortStableFunc(v.cps, func(a, b Checkpoint) int { return cmp.Compare(a.LastSeq, b.LastSeq) })
	v.summary.Checkpoints = len(v.cps)
}

func (v *chainVerifier) run() error {
	v.firstProblem = len(v.rep.Problems)
	v.summary.Controller = v.controller
	v.prepareCheckpoints()
	v.lastHash = genesisPrev
	v.misnamed = map[string]bool{}
	files, err := listSegments(v.dir)
	if err != nil {
		return err
	}
	v.segNames = map[string]bool{}
	segs := make([]*vseg, 0, len(files))
	for _, f := range files {
		v.segNames[f.name] = true
		segs = append(segs, v.load(f))
	}
	v.summary.Segments = len(segs)

	// Foreign segments (another controller's records under this name) are
	// reported once and left out of the chain.
	var own []*vseg
	for i, s := range segs {
		if s.readErr != nil {
			v.add(Problem{Kind: ProblemUnreadable, Segment: s.name, Detail: s.readErr.Error()})
			continue
		}
		if s.foreign != "" {
			lo, hi := seqRange(s)
			v.add(Problem{Kind: ProblemSegmentSwapped, Segment: s.name, Seq: lo, SeqEnd: hi,
				Detail: fmt.Sprintf("segment holds records of controller %q, not of %q", s.foreign, v.controller)})
			end := uint64(1<<64 - 1)
			if i+1 < len(files) {
				end = files[i+1].first - 1
			}
			v.explained = append(v.explained, [2]uint64{s.nameSeq, end})
			continue
		}
		own = append(own, s)
	}
	// Chain order: by the seqs the segments hold (their names may lie).
	slices.SortStableFunc(own, func(a, b *vseg) int {
		return cmp.Or(cmp.Compare(a.median, b.median), cmp.Compare(a.name, b.name))
	})
	for i, s := range own {
		next := uint64(1<<64 - 1)
		if i+1 < len(own) {
			next = startAfter(own[i+1], s.median)
		}
		v.segment(s, next)
	}
	v.reportSwaps(own)
	if end := v.sealedCut(1<<32 - 1); end != 0 {
		v.explained = append(v.explained, [2]uint64{v.lastSeq + 1, end})
	}
	v.checkRemainingCheckpoints()
	mine := v.rep.Problems[v.firstProblem:]
	slices.SortStableFunc(mine, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Segment, b.Segment), cmp.Compare(a.Line, b.Line))
	})
	v.summary.LastSeq, v.summary.Head = v.lastSeq, v.lastHash
	if v.lastSeq == 0 {
		v.summary.Head = ""
	}
	v.summary.Anchored = v.lastGood
	if v.lastSeq > v.lastGood {
		v.summary.Unanchored = v.lastSeq - v.lastGood
	}
	v.rep.Chains = append(v.rep.Chains, v.summary)
	return nil
}

// load reads one segment file into lines.
func (v *chainVerifier) load(f segFile) *vseg {
	s := &vseg{name: f.name, nameSeq: f.first}
	lr, err := openLines(filepath.Join(v.dir, f.name), 0, -1)
	if err != nil {
		s.readErr = err
		return s
	}
	defer lr.close()
	var scratch []byte
	n := 0
	for {
		b, _, torn, err := lr.next()
		if err == io.EOF {
			if len(torn) > 0 {
				s.torn, s.tornLine = slices.Clone(torn), n+1
			}
			break
		}
		if err != nil {
			s.readErr = err
			return s
		}
		n++
		var c lineCheck
		c, scratch = checkLine(b, scratch)
		l := vline{line: n, parsed: c.parsed, hashOK: c.hashOK, problem: c.problem}
		if c.parsed {
			l.seq, l.ts, l.controller, l.prev, l.hash = c.rec.Seq, c.rec.Time, c.rec.Controller, c.rec.Prev, c.rec.Hash
		}
		s.lines = append(s.lines, l)
	}
	var seqs []uint64
	foreign, own := "", 0
	for _, l := range s.lines {
		if !l.parsed {
			continue
		}
		if l.controller == v.controller {
			own++
			seqs = append(seqs, l.seq)
		} else {
			foreign = l.controller
		}
	}
	if own == 0 && foreign != "" {
		s.foreign = foreign
		for _, l := range s.lines {
			if l.parsed {
				seqs = append(seqs, l.seq)
			}
		}
	}
	if len(seqs) == 0 {
		s.median = s.nameSeq
	} else {
		slices.Sort(seqs)
		s.median = seqs[len(seqs)/2]
	}
	return s
}

// seqRange returns the smallest and largest seq of the parsed lines of s
// (0, 0 when none).
func seqRange(s *vseg) (lo, hi uint64) {
	return seqSpan(s, func(l *vline) bool { return l.parsed })
}

// chainRange returns the smallest and largest seq of the lines of s placed
// in the chain (0, 0 when none).
func chainRange(s *vseg) (lo, hi uint64) {
	return seqSpan(s, func(l *vline) bool { return l.role == roleChain || l.role == roleReordered })
}

func seqSpan(s *vseg, keep func(*vline) bool) (lo, hi uint64) {
	for i := range s.lines {
		l := &s.lines[i]
		if !keep(l) {
			continue
		}
		if lo == 0 || l.seq < lo {
			lo = l.seq
		}
		hi = max(hi, l.seq)
	}
	return lo, hi
}

// startAfter is where segment s starts: its name, if it holds an intact
// record with that seq; else judged from its intact records, the smallest
// seq above the previous segment's median.
func startAfter(s *vseg, prevMedian uint64) uint64 {
	best := uint64(1<<64 - 1)
	for _, l := range s.lines {
		if l.hashOK && l.seq == s.nameSeq {
			return s.nameSeq
		}
		if l.hashOK && l.seq > prevMedian && l.seq < best {
			best = l.seq
		}
	}
	return best
}

// segment checks one segment of the chain. next is where the following
// segment starts (records at or past it do not belong here).
func (v *chainVerifier) segment(s *vseg, next uint64) {
	for i := range s.lines {
		l := &s.lines[i]
		switch {
		case !l.parsed:
			v.add(Problem{Kind: ProblemMalformed, Segment: s.name, Line: l.line, Detail: l.problem})
		case l.controller != v.controller:
			v.add(Problem{Kind: ProblemForeign, Segment: s.name, Line: l.line, Seq: l.seq,
				Detail: fmt.Sprintf("record of controller %q inserted into the chain of %q", l.controller, v.controller)})
			l.role = roleInserted
		case !l.hashOK:
			v.add(Problem{Kind: ProblemEdited, Segment: s.name, Line: l.line, Seq: l.seq, Detail: l.problem})
		}
	}
	// Candidates: own records in range, one per seq.
	bySeq := map[uint64][]*vline{}
	var cand []*vline
	for i := range s.lines {
		l := &s.lines[i]
		if !l.parsed || l.role == roleInserted {
			continue
		}
		if l.seq <= v.lastSeq || l.seq >= next {
			where := fmt.Sprintf("the chain is already at seq %d", v.lastSeq)
			if l.seq >= next {
				where = fmt.Sprintf("the next segment starts at seq %d", next)
			}
			v.misplaced(s, l, fmt.Sprintf("seq %d does not belong in this segment: %s", l.seq, where))
			continue
		}
		bySeq[l.seq] = append(bySeq[l.seq], l)
	}
	hashes := map[string]uint64{}
	prevs := map[string]bool{}
	for _, ls := range bySeq {
		for _, l := range ls {
			hashes[l.hash] = l.seq
			prevs[l.prev] = true
		}
	}
	seqs := make([]uint64, 0, len(bySeq))
	for seq := range bySeq {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	for _, seq := range seqs {
		ls := bySeq[seq]
		best := ls[0]
		if len(ls) > 1 {
			score := func(l *vline) int {
				sc := 0
				if l.hashOK {
					sc += 4
				}
				if p, ok := hashes[l.prev]; (ok && p == seq-1) || (seq == v.lastSeq+1 && l.prev == v.lastHash) {
					sc += 2
				}
				if prevs[l.hash] {
					sc++
				}
				return sc
			}
			for _, l := range ls[1:] {
				if score(l) > score(best) {
					best = l
				}
			}
			for _, l := range ls {
				if l != best {
					v.misplaced(s, l, fmt.Sprintf("duplicate of seq %d at line %d", seq, best.line))
				}
			}
		}
		cand = append(cand, best)
	}
	slices.SortFunc(cand, func(a, b *vline) int { return cmp.Compare(a.line, b.line) })
	inLIS := lis(cand)
	var maxLIS uint64
	nOut := 0
	for i, l := range cand {
		if inLIS[i] {
			maxLIS = max(maxLIS, l.seq)
		} else {
			nOut++
		}
	}
	var chain []*vline
	for i, l := range cand {
		switch {
		case inLIS[i]:
			l.role = roleChain
			chain = append(chain, l)
		case l.seq <= maxLIS+uint64(nOut):
			l.role = roleReordered
			chain = append(chain, l)
			v.add(Problem{Kind: ProblemReordered, Segment: s.name, Line: l.line, Seq: l.seq,
				Detail: "record out of order: " + v.neighbours(cand, i)})
		default:
			v.misplaced(s, l, fmt.Sprintf("seq %d out of order and past the end of this segment's records", l.seq))
		}
	}
	slices.SortFunc(chain, func(a, b *vline) int { return cmp.Compare(a.seq, b.seq) })
	var first *vline
	firstPrevSeq := v.lastSeq
	for _, l := range chain {
		if first == nil {
			first = l
		}
		want := v.lastSeq + 1
		if l.seq > want {
			v.gap(s, want, l.seq-1, l, l == first)
		} else {
			v.link(s, l)
		}
		if l.ts.Before(v.lastTS) && l.hashOK {
			v.add(Problem{Kind: ProblemTimeOrder, Segment: s.name, Line: l.line, Seq: l.seq,
				Detail: fmt.Sprintf("time %s is before its predecessor's %s", l.ts.Format(timeLayout), v.lastTS.Format(timeLayout))})
		}
		v.checkpointsAt(s, l)
		if v.summary.FirstSeq == 0 {
			v.summary.FirstSeq = l.seq
		}
		v.summary.Records++
		v.lastSeq, v.lastHash, v.lastTS = l.seq, l.hash, l.ts
		v.lastSeg, v.lastLine, v.lastBad = s, l.line, !l.hashOK
	}
	if first != nil && !(s.nameSeq > firstPrevSeq && s.nameSeq <= first.seq) {
		v.misnamed[s.name] = true
	}
	if len(s.torn) > 0 {
		v.add(Problem{Kind: ProblemTorn, Segment: s.name, Line: s.tornLine,
			Detail: fmt.Sprintf("incomplete last line of %d bytes (a cut inside a record, or a write that never finished)", len(s.torn))})
	}
}

// endLine is the line just past the last line of s.
func endLine(s *vseg) int { return len(s.lines) + 1 }

// misplaced reports a record that is not part of the chain; an edited one
// (already reported) is only counted as a damaged line.
func (v *chainVerifier) misplaced(s *vseg, l *vline, detail string) {
	if !l.hashOK {
		l.role = roleSuspect
		return
	}
	l.role = roleInserted
	v.add(Problem{Kind: ProblemInserted, Segment: s.name, Line: l.line, Seq: l.seq, Detail: detail})
}

func (v *chainVerifier) neighbours(cand []*vline, i int) string {
	l := cand[i]
	var before, after *vline
	for _, o := range cand {
		if o.seq < l.seq && (before == nil || o.seq > before.seq) {
			before = o
		}
		if o.seq > l.seq && (after == nil || o.seq < after.seq) {
			after = o
		}
	}
	switch {
	case before != nil && after != nil:
		return fmt.Sprintf("seq %d belongs between seq %d (line %d) and seq %d (line %d)", l.seq, before.seq, before.line, after.seq, after.line)
	case after != nil:
		return fmt.Sprintf("seq %d belongs before seq %d (line %d)", l.seq, after.seq, after.line)
	case before != nil:
		return fmt.Sprintf("seq %d belongs after seq %d (line %d)", l.seq, before.seq, before.line)
	}
	return fmt.Sprintf("seq %d", l.seq)
}

// link checks that l (seq lastSeq+1) holds the hash of its predecessor.
func (v *chainVerifier) link(s *vseg, l *vline) {
	if l.prev == v.lastHash || v.lastBad || !l.hashOK {
		return // an edited record is already reported
	}
	if v.lastSeq == 0 {
		v.add(Problem{Kind: ProblemInserted, Segment: s.name, Line: l.line, Seq: l.seq,
			Detail: "the first record of the chain does not start from the genesis hash"})
		return
	}
	where := fmt.Sprintf("line %d", v.lastLine)
	if v.lastSeg != s {
		where = fmt.Sprintf("%s line %d", v.lastSeg.name, v.lastLine)
	}
	v.add(Problem{Kind: ProblemRewritten, Segment: v.lastSeg.name, Line: v.lastLine, Seq: v.lastSeq,
		Detail: fmt.Sprintf("seq %d (%s) has hash %.16s… but seq %d (%s line %d) chained to %.16s…: seq %d was replaced or edited and re-hashed",
			v.lastSeq, where, v.lastHash, l.seq, s.name, l.line, l.prev, v.lastSeq)})
}

// gap reports records want..upTo missing before l.
func (v *chainVerifier) gap(s *vseg, want, upTo uint64, l *vline, firstInSegment bool) {
	if v.isExplained(want, upTo) {
		return
	}
	// Damaged lines in between (already reported) may be the records.
	damaged := 0
	for _, o := range s.lines {
		if o.line > v.lastLineIn(s) && o.line < l.line && (!o.parsed || o.role == roleSuspect) {
			damaged++
		}
	}
	if uint64(damaged) == upTo-want+1 {
		return
	}
	if !firstInSegment || v.lastSeg == s {
		v.add(Problem{Kind: ProblemDeleted, Segment: s.name, Line: l.line, Seq: want, SeqEnd: upTo,
			Detail: fmt.Sprintf("records seq %d..%d are missing before line %d (seq %d)", want, upTo, l.line, l.seq)})
		return
	}
	// At a segment boundary: the end of the previous segment, whole
	// segments, or the start of this one. want is v.lastSeq+1.
	if end := v.sealedCut(upTo - v.lastSeq); end != 0 {
		want = end + 1
		if want > upTo {
			return
		}
	}
	if s.nameSeq == l.seq && !v.segNames[SegmentName(want)] {
		v.add(Problem{Kind: ProblemSegmentMissing, Segment: SegmentName(want), Seq: want, SeqEnd: upTo,
			Detail: fmt.Sprintf("records seq %d..%d are missing between %s and %s: segment %s was deleted", want, upTo, v.lastSegName(), s.name, SegmentName(want))})
		return
	}
	v.add(Problem{Kind: ProblemDeleted, Segment: s.name, Line: l.line, Seq: want, SeqEnd: upTo,
		Detail: fmt.Sprintf("records seq %d..%d are missing before line %d (seq %d)", want, upTo, l.line, l.seq)})
}

// sealedCut reports the last records of the chain's last segment as cut
// when its index was sealed at a seq past the chain's end, by at most within
// records. It returns that seq, or 0 when it reported nothing.
func (v *chainVerifier) sealedCut(within uint64) uint64 {
	if v.lastSeg == nil {
		return 0
	}
	_, seal := readIndex(filepath.Join(v.dir, indexName(v.lastSeg.name)))
	if seal == nil || seal.Seq <= v.lastSeq || seal.Seq-v.lastSeq > within {
		return 0
	}
	v.add(Problem{Kind: ProblemTruncated, Segment: v.lastSeg.name, Line: endLine(v.lastSeg), Seq: v.lastSeq + 1, SeqEnd: seal.Seq,
		Detail: fmt.Sprintf("the segment was sealed at seq %d (count %d) but ends at seq %d: its last records were cut", seal.Seq, seal.Count, v.lastSeq)})
	return seal.Seq
}

func (v *chainVerifier) isExplained(lo, hi uint64) bool {
	for _, r := range v.explained {
		if lo >= r[0] && hi <= r[1] {
			return true
		}
	}
	return false
}

func (v *chainVerifier) lastLineIn(s *vseg) int {
	if v.lastSeg == s {
		return v.lastLine
	}
	return 0
}

func (v *chainVerifier) lastSegName() string {
	if v.lastSeg == nil {
		return "the start of the chain"
	}
	return v.lastSeg.name
}

// checkpointsAt checks the checkpoints whose head is l, and notes those that
// fell in a gap (already reported).
func (v *chainVerifier) checkpointsAt(s *vseg, l *vline) {
	for v.ci < len(v.cps) && v.cps[v.ci].LastSeq <= l.seq {
		cp := v.cps[v.ci]
		v.ci++
		if cp.LastSeq < l.seq {
			continue // inside missing records, reported as such
		}
		at := fmt.Sprintf("checkpoint of %s", cp.Time.UTC().Format(time.RFC3339))
		switch {
		case cp.Head != l.hash:
			v.add(Problem{Kind: ProblemCheckpoint, Segment: s.name, Line: l.line, Seq: v.lastGood + 1, SeqEnd: l.seq,
				Detail: fmt.Sprintf("seq %d has hash %.16s… but the %s says %.16s…: the chain was rewritten between seq %d and seq %d",
					l.seq, l.hash, at, cp.Head, v.lastGood+1, l.seq)})
		case cp.Segment != s.name && !v.misnamedNow(s):
			v.add(Problem{Kind: ProblemCheckpoint, Segment: s.name, Line: l.line, Seq: l.seq,
				Detail: fmt.Sprintf("the %s places seq %d in segment %s", at, l.seq, cp.Segment)})
		case cp.Segment == s.name && !v.misnamedNow(s) && cp.Count != l.seq-s.nameSeq+1:
			v.add(Problem{Kind: ProblemCheckpoint, Segment: s.name, Line: l.line, Seq: l.seq,
				Detail: fmt.Sprintf("the %s counts %d records in the segment up to seq %d, the name implies %d", at, cp.Count, l.seq, l.seq-s.nameSeq+1)})
		default:
			v.lastGood = l.seq
		}
	}
}

// misnamedNow reports whether s's name disagrees with the seqs it holds
// (decided before its first chain record is checked).
func (v *chainVerifier) misnamedNow(s *vseg) bool {
	lo, _ := chainRange(s) // s holds the chain record being checked: lo > 0
	return lo != s.nameSeq
}

// checkRemainingCheckpoints reports checkpoints past the end of the chain:
// a cut tail, or deleted last segments.
func (v *chainVerifier) checkRemainingCheckpoints() {
	rest := v.cps[v.ci:]
	if len(rest) == 0 {
		return
	}
	type span struct {
		name   string
		first  uint64
		last   uint64
		count  uint64
		latest time.Time
	}
	var spans []*span
	idx := map[string]*span{}
	for _, cp := range rest {
		sp := idx[cp.Segment]
		if sp == nil {
			first, _ := parseSegmentName(cp.Segment)
			sp = &span{name: cp.Segment, first: first}
			idx[cp.Segment] = sp
			spans = append(spans, sp)
		}
		if cp.LastSeq >= sp.last {
			sp.last, sp.count, sp.latest = cp.LastSeq, cp.Count, cp.Time
		}
	}
	sort.SliceStable(spans, func(i, j int) bool { return spans[i].first < spans[j].first })
	from := v.lastSeq + 1
	for _, sp := range spans {
		if sp.last < from || v.isExplained(max(from, sp.first), sp.last) {
			continue
		}
		at := fmt.Sprintf("the checkpoint of %s covers seq %d (count %d in %s)", sp.latest.UTC().Format(time.RFC3339), sp.last, sp.count, sp.name)
		if sp.first > from && v.lastSeg != nil {
			v.add(Problem{Kind: ProblemTruncated, Segment: v.lastSeg.name, Line: endLine(v.lastSeg), Seq: from, SeqEnd: sp.first - 1,
				Detail: fmt.Sprintf("the chain ends at seq %d but %s: records %d..%d were cut", v.lastSeq, at, from, sp.first-1)})
			from = sp.first
		}
		lo := max(from, sp.first)
		if v.segNames[sp.name] {
			line := 1
			if v.lastSeg != nil && v.lastSeg.name == sp.name {
				line = endLine(v.lastSeg)
			}
			v.add(Problem{Kind: ProblemTruncated, Segment: sp.name, Line: line, Seq: lo, SeqEnd: sp.last,
				Detail: fmt.Sprintf("the chain ends at seq %d but %s: records %d..%d were cut", v.lastSeq, at, lo, sp.last)})
		} else {
			v.add(Problem{Kind: ProblemSegmentMissing, Segment: sp.name, Seq: lo, SeqEnd: sp.last,
				Detail: fmt.Sprintf("segment %s is missing: %s", sp.name, at)})
		}
		from = sp.last + 1
	}
	v.ci = len(v.cps)
}

// reportSwaps reports segments whose names disagree with the records they
// hold, naming the partner when two segments hold each other's records.
func (v *chainVerifier) reportSwaps(own []*vseg) {
	byStart := map[uint64]string{}
	for _, s := range own {
		lo, _ := chainRange(s)
		byStart[lo] = s.name
	}
	for _, s := range own {
		if !v.misnamed[s.name] {
			continue
		}
		lo, hi := chainRange(s)
		detail := fmt.Sprintf("segment holds seq %d..%d but its name says it starts at seq %d", lo, hi, s.nameSeq)
		if partner, ok := byStart[s.nameSeq]; ok && partner != s.name && v.misnamed[partner] {
			detail += fmt.Sprintf(" (swapped with %s)", partner)
		}
		v.add(Problem{Kind: ProblemSegmentSwapped, Segment: s.name, Seq: lo, SeqEnd: hi, Detail: detail})
	}
}

// lis marks a longest strictly increasing subsequence (by seq) of ls, which
// is in file order. O(n log n) patience sorting.
func lis(ls []*vline) []bool {
	n := len(ls)
	tails := make([]int, 0, n) // index into ls of the smallest tail of each length
	prev := make([]int, n)
	for i, l := range ls {
		k := sort.Search(len(tails), func(j int) bool { return ls[tails[j]].seq >= l.seq })
		if k > 0 {
			prev[i] = tails[k-1]
		} else {
			prev[i] = -1
		}
		if k == len(tails) {
			tails = append(tails, i)
		} else {
			tails[k] = i
		}
	}
	in := make([]bool, n)
	if len(tails) == 0 {
		return in
	}
	for i := tails[len(tails)-1]; i >= 0; i = prev[i] {
		in[i] = true
	}
	return in
}
