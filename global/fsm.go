package global

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// Result is what applying one command produced. A command whose request id
// was already applied returns the first result again with Duplicate set.
type Result struct {
	// Index is the Raft index of the (first) application.
	Index uint64 `json:"index"`
	// Changed is false when the command was valid but changed nothing (the
	// region already was in that state, the member was unchanged, ...).
	Changed    bool           `json:"changed"`
	Duplicate  bool           `json:"duplicate,omitempty"`
	Policy     *PolicyVersion `json:"policy,omitempty"`
	Region     *RegionStatus  `json:"region,omitempty"`
	Checkpoint *Checkpoint    `json:"checkpoint,omitempty"`
	Member     *Member        `json:"member,omitempty"`
	Err        *RejectedError `json:"error,omitempty"`
}

// fsm is the replicated state machine. Apply, Snapshot and Restore are
// called by Raft from one goroutine; readers only load the atomic pointer.
type fsm struct {
	state atomic.Pointer[State]
	// applied is the Raft index of the last command this machine applied
	// (or of the last one a restored snapshot holds). Raft's own
	// AppliedIndex moves when a batch is queued to the state machine, before
	// it is applied; this one moves after state holds the command.
	applied   atomic.Uint64
	appliedMu sync.Mutex
	appliedCh chan struct{} // closed at the next advance of applied; nil when nobody waits
	dedup     dedup
	compile   func(doc []byte) (any, error) // may be nil
	// observe, if set, is called after every applied command (on the Raft
	// FSM goroutine; it must not block).
	observe func(op op, res *Result, st *State)
	// onRestore, if set, is called after a snapshot replaced the state.
	onRestore func()
}

var _ raft.FSM = (*fsm)(nil)

func newFSM(compile func([]byte) (any, error)) *fsm {
	f := &fsm{compile: compile}
	f.dedup.init(DedupWindow)
	f.state.Store(emptyState())
	return f
}

// Apply implements raft.FSM.
func (f *fsm) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	res := f.applyCommand(l.Index, l.Data)
	return &res
}

func (f *fsm) applyCommand(index uint64, data []byte) Result {
	defer f.setApplied(index)
	c, err := decodeCommand(data)
	if err != nil {
		res := Result{Index: index, Err: rejectf(CodeInvalid, "%v", err)}
		f.notify("", &res)
		return res
	}
	if r, ok := f.dedup.get(c.RequestID); ok {
		r.Duplicate = true
		f.notify(c.Op, &r)
		return r
	}
	res := f.execute(index, c)
	f.dedup.put(c.RequestID, res)
	f.notify(c.Op, &res)
	return res
}

// setApplied records that state holds every command up to index and wakes
// the waiters.
func (f *fsm) setApplied(index uint64) {
	f.applied.Store(index)
	f.appliedMu.Lock()
	if f.appliedCh != nil {
		close(f.appliedCh)
		f.appliedCh = nil
	}
	f.appliedMu.Unlock()
}

// appliedChanged returns a channel closed at the next setApplied.
func (f *fsm) appliedChanged() <-chan struct{} {
	f.appliedMu.Lock()
	defer f.appliedMu.Unlock()
	if f.appliedCh == nil {
		f.appliedCh = make(chan struct{})
	}
	return f.appliedCh
}

// waitApplied waits until the machine has applied index (true) or done is
// closed (false).
func (f *fsm) waitApplied(done <-chan struct{}, index uint64) bool {
	for {
		ch := f.appliedChanged() // before the load: an advance after it closes ch
		if f.applied.Load() >= index {
			return true
		}
		select {
		case <-done:
			return false
		case <-ch:
		}
	}
}

func (f *fsm) notify(o op, res *Result) {
	if f.observe != nil {
		f.observe(o, res, f.state.Load())
	}
}

func (f *fsm) execute(index uint64, c *command) Result {
	if rej := c.validate(); rej != nil {
		return Result{Index: index, Err: rej}
	}
	cur := f.state.Load()
	var (
		next *State
		res  = Result{Index: index}
	)
	switch c.Op {
	case opPolicyApply:
		next, res.Policy = f.applyPolicy(cur, index, c)
	case opRegionSet:
		next, res.Region, res.Err = applyRegion(cur, index, c)
	case opTargetsSet:
		next = applyTargets(cur, c)
	case opCheckpoint:
		next, res.Checkpoint, res.Err = applyCheckpoint(cur, index, c)
	case opMemberUpsert, opMemberRemove:
		next, res.Member = applyMember(cur, index, c)
	}
	if next != nil {
		next.index = index
		f.state.Store(next)
		res.Changed = true
	}
	return res
}

// applyPolicy makes c's document the active policy, as a new version; with
// UnlessActive (every apply since it exists), a document identical (by
// SHA-256) to the active one changes nothing (nil state) and answers the
// active version, so that an operator or a GitOps loop that applies the
// same file again adds no version. The state machine decides it, so two
// concurrent applies of one document make one version.
func (f *fsm) applyPolicy(cur *State, index uint64, c *command) (*State, *PolicyVersion) {
	p := c.Policy
	sum := sha256.Sum256(p.Document)
	var version uint64 = 1
	if n := len(cur.history); n > 0 {
		active := cur.history[n-1]
		if p.UnlessActive && active.SHA256 == hex.EncodeToString(sum[:]) {
			active.Document = nil
			return nil, &active
		}
		version = active.Version + 1
	}
	pv := PolicyVersion{
		Version:   version,
		Index:     index,
		Name:      p.Name,
		Declared:  p.Declared,
		SHA256:    hex.EncodeToString(sum[:]),
		Size:      len(p.Document),
		AppliedAt: c.at(),
		Actor:     c.Actor,
		Reason:    p.Reason,
		RequestID: c.RequestID,
		Document:  bytes.Clone(p.Document),
	}
	hist := make([]PolicyVersion, 0, len(cur.history)+1)
	hist = append(hist, cur.history...)
	hist = append(hist, pv)
	if len(hist) > PolicyHistoryKept {
		hist = hist[len(hist)-PolicyHistoryKept:]
	}
	if i := len(hist) - PolicyDocsKept - 1; i >= 0 {
		hist[i].Document = nil
	}
	next := cur.clone()
	next.history = hist
	f.compileActive(next, pv)
	meta := pv
	meta.Document = nil
	return next, &meta
}

// compileActive sets the node-local forms of st's active policy pv: the
// compiled policy and its version string.
func (f *fsm) compileActive(st *State, pv PolicyVersion) {
	st.compiled, st.compileErr = f.compileDoc(pv.Document)
	st.policyVersion = pv.Ref()
	if p, ok := st.compiled.(interface{ ID() string }); ok && st.compileErr == nil {
		st.policyVersion += "/" + p.ID()
	}
}

func (f *fsm) compileDoc(doc []byte) (any, error) {
	if f.compile == nil || doc == nil {
		return nil, nil
	}
	v, err := f.compile(doc)
	if err != nil {
		return nil, fmt.Errorf("compile active policy: %w", err)
	}
	return v, nil
}

func applyRegion(cur *State, index uint64, c *command) (*State, *RegionStatus, *RejectedError) {
	rc := c.Region
	old, exists := cur.regions[rc.Region]
	if !exists && !rc.Force && !cur.knowsRegion(rc.Region) {
		known := cur.KnownRegions()
		return nil, nil, rejectf(CodeUnknownRegion, "region %q is not known to the cluster (known: %s)", rc.Region, listOrNone(known))
	}
	if rc.Expect != nil && *rc.Expect != old.State {
		return nil, nil, rejectf(CodeConflict, "region %q is %s, expected %s", rc.Region, old.State, *rc.Expect)
	}
	if old.State == rc.State {
		if !exists {
			old.Region = rc.Region
		}
		return nil, &old, nil
	}
	st := RegionStatus{
		Region:    rc.Region,
		State:     rc.State,
		Since:     c.at(),
		Actor:     c.Actor,
		Reason:    rc.Reason,
		Automatic: rc.Automatic,
		Index:     index,
	}
	next := cur.clone()
	next.regions = maps.Clone(cur.regions)
	next.regions[rc.Region] = st
	return next, &st, nil
}

func applyTargets(cur *State, c *command) *State {
	t := c.Targets
	if old, ok := cur.targets[t.Region]; ok && slices.Equal(old, t.Targets) || !ok && len(t.Targets) == 0 {
		return nil
	}
	next := cur.clone()
	next.targets = maps.Clone(cur.targets)
	if len(t.Targets) == 0 {
		delete(next.targets, t.Region)
	} else {
		next.targets[t.Region] = append([]string(nil), t.Targets...)
	}
	return next
}

func applyCheckpoint(cur *State, index uint64, c *command) (*State, *Checkpoint, *RejectedError) {
	cp := *c.Checkpoint
	list := cur.checkpoints[cp.ControllerID]
	if n := len(list); n > 0 {
		last := list[n-1]
		switch {
		case cp.Sequence < last.Sequence:
			return nil, nil, rejectf(CodeConflict, "checkpoint sequence %d of %q is older than the recorded %d", cp.Sequence, cp.ControllerID, last.Sequence)
		case cp.Sequence == last.Sequence:
			if cp.Segment == last.Segment && cp.HeadHash == last.HeadHash && cp.Count == last.Count {
				return nil, &last, nil
			}
			return nil, nil, rejectf(CodeConflict, "checkpoint sequence %d of %q differs from the recorded one (segment %s head %s count %d)",
				cp.Sequence, cp.ControllerID, last.Segment, last.HeadHash, last.Count)
		}
	}
	cp.Index = index
	keep := list
	if len(keep) >= CheckpointsKept {
		keep = keep[len(keep)-CheckpointsKept+1:]
	}
	nl := make([]Checkpoint, 0, len(keep)+1)
	nl = append(nl, keep...)
	nl = append(nl, cp)
	next := cur.clone()
	next.checkpoints = maps.Clone(cur.checkpoints)
	next.checkpoints[cp.ControllerID] = nl
	return next, &cp, nil
}

func applyMember(cur *State, index uint64, c *command) (*State, *Member) {
	m := *c.Member
	old, exists := cur.members[m.ID]
	if c.Op == opMemberRemove {
		if !exists {
			return nil, nil
		}
		next := cur.clone()
		next.members = maps.Clone(cur.members)
		delete(next.members, m.ID)
		return next, &old
	}
	if exists && old.sameAddrs(m) {
		return nil, &old
	}
	m.Since = c.at()
	if exists {
		m.Since = old.Since
	}
	m.Index = index
	next := cur.clone()
	next.members = maps.Clone(cur.members)
	next.members[m.ID] = m
	return next, &m
}

// Snapshot implements raft.FSM. The State is immutable, so capturing it is a
// pointer copy; the dedup window is copied because Apply mutates it while
// Persist runs.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	return &fsmSnapshot{state: f.state.Load(), applied: f.applied.Load(), dedup: f.dedup.entries()}, nil
}

// Restore implements raft.FSM: it discards all previous state.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("restore snapshot: read: %w", err)
	}
	st, applied, entries, err := decodeSnapshot(b)
	if err != nil {
		return fmt.Errorf("restore snapshot: %w", err)
	}
	if p, ok := st.Policy(); ok {
		f.compileActive(st, p)
	}
	f.dedup.init(len(f.dedup.ring))
	for _, e := range entries {
		f.dedup.put(e.RequestID, e.Result)
	}
	f.state.Store(st)
	f.setApplied(applied)
	if f.onRestore != nil {
		f.onRestore()
	}
	return nil
}

type fsmSnapshot struct {
	state   *State
	applied uint64
	dedup   []dedupEntry
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	b, err := encodeSnapshot(s.state, s.applied, s.dedup)
	if err == nil {
		_, err = sink.Write(b)
	}
	if err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("persist snapshot: %w", err)
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() {}

// snapshotVersion is the version of the snapshot encoding (see doc.go).
const snapshotVersion = 1

type snapshotDoc struct {
	V     int    `json:"v"`
	Index uint64 `json:"index"`
	// Applied is the index of the last command applied (changing the state
	// or not); absent in snapshots of older controllers, which read as Index.
	Applied     uint64           `json:"applied,omitempty"`
	History     []PolicyVersion  `json:"policy_history"`
	Regions     []RegionStatus   `json:"regions"`
	Targets     []targetsCmd     `json:"targets"`
	Checkpoints []checkpointList `json:"checkpoints"`
	Members     []Member         `json:"members"`
	Dedup       []dedupEntry     `json:"dedup,omitempty"`
}

type checkpointList struct {
	ControllerID string       `json:"controller_id"`
	Checkpoints  []Checkpoint `json:"checkpoints"`
}

// encodeSnapshot is canonical: equal states (at the same applied index)
// give equal bytes.
func encodeSnapshot(s *State, applied uint64, dedup []dedupEntry) ([]byte, error) {
	doc := snapshotDoc{
		V:           snapshotVersion,
		Index:       s.index,
		Applied:     applied,
		History:     s.history,
		Regions:     s.Regions(),
		Targets:     make([]targetsCmd, 0, len(s.targets)),
		Checkpoints: make([]checkpointList, 0, len(s.checkpoints)),
		Members:     s.Members(),
		Dedup:       dedup,
	}
	for r, t := range s.targets {
		doc.Targets = append(doc.Targets, targetsCmd{Region: r, Targets: t})
	}
	sort.Slice(doc.Targets, func(i, j int) bool { return doc.Targets[i].Region < doc.Targets[j].Region })
	for _, c := range s.CheckpointControllers() {
		doc.Checkpoints = append(doc.Checkpoints, checkpointList{ControllerID: c, Checkpoints: s.checkpoints[c]})
	}
	return json.Marshal(doc)
}

func decodeSnapshot(b []byte) (*State, uint64, []dedupEntry, error) {
	var doc snapshotDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, 0, nil, fmt.Errorf("decode: %w", err)
	}
	if doc.V != snapshotVersion {
		return nil, 0, nil, fmt.Errorf("snapshot version %d is not supported (this controller reads version %d)", doc.V, snapshotVersion)
	}
	st := emptyState()
	st.index = doc.Index
	st.history = doc.History
	for _, r := range doc.Regions {
		st.regions[r.Region] = r
	}
	for _, t := range doc.Targets {
		st.targets[t.Region] = t.Targets
	}
	for _, c := range doc.Checkpoints {
		st.checkpoints[c.ControllerID] = c.Checkpoints
	}
	for _, m := range doc.Members {
		st.members[m.ID] = m
	}
	return st, max(doc.Applied, doc.Index), doc.Dedup, nil
}

// dedup remembers the results of the latest DedupWindow request ids, in
// application order, so a retried command returns its first result.
type dedup struct {
	ring []dedupEntry
	next int // position of the next write
	full bool
	idx  map[string]int
}

type dedupEntry struct {
	RequestID string `json:"rid"`
	Result    Result `json:"result"`
}

// init empties the window and sizes it to n entries (DedupWindow in
// production; tests use small windows to reach eviction).
func (d *dedup) init(n int) {
	d.ring = make([]dedupEntry, n)
	d.next, d.full = 0, false
	d.idx = make(map[string]int)
}

func (d *dedup) get(rid string) (Result, bool) {
	i, ok := d.idx[rid]
	if !ok {
		return Result{}, false
	}
	return d.ring[i].Result, true
}

func (d *dedup) put(rid string, r Result) {
	if d.full {
		delete(d.idx, d.ring[d.next].RequestID)
	}
	d.ring[d.next] = dedupEntry{RequestID: rid, Result: r}
	d.idx[rid] = d.next
	d.next++
	if d.next == len(d.ring) {
		d.next, d.full = 0, true
	}
}

// entries returns the remembered entries, oldest first.
func (d *dedup) entries() []dedupEntry {
	if !d.full {
		return append([]dedupEntry(nil), d.ring[:d.next]...)
	}
	out := make([]dedupEntry, 0, len(d.ring))
	out = append(out, d.ring[d.next:]...)
	return append(out, d.ring[:d.next]...)
}

func listOrNone(xs []string) string {
	if len(xs) == 0 {
		return "none"
	}
	return strings.Join(xs, ", ")
}
