package route

import (
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
)

// PodInfo is what the controller knows about one inference pod: from its
// lifecycle events on the region's topic, or from static configuration.
type PodInfo struct {
	Name     string `json:"name" yaml:"name"`
	Endpoint string `json:"endpoint" yaml:"endpoint"` // base URL of its OpenAI-compatible API
	Model    string `json:"model" yaml:"model"`
	Profile  string `json:"profile" yaml:"profile"` // hardware profile (gorgo)
	// Engine is the engine kind, "vllm", "sglang" or "trtllm": which metric
	// names its /metrics has. Empty: vLLM's.
	Engine string `json:"engine,omitempty" yaml:"engine"`
	// KVBlocks is the pod's KV-cache capacity in engine blocks (GPU plus
	// offload tiers); 0: unknown. It sizes the pod's re-keyer.
	KVBlocks int    `json:"kv_blocks,omitempty" yaml:"kv_blocks"`
	Epoch    uint64 `json:"epoch" yaml:"-"`
	Static   bool   `json:"static,omitempty" yaml:"-"`
}

// SaltBlind reports whether the pod's KV events cannot carry a cache salt:
// TensorRT-LLM's streaming events have no salt field (its KV cache manager
// v2 salts its block keys, but salt-aware event keys are out of the
// publisher's scope, TensorRT-LLM #13589), so a salted block is announced
// like an unsalted one.
func (i PodInfo) SaltBlind() bool { return i.Engine == "trtllm" }

// Pod is one pod with its live load accounting and health. Load counters are
// the router's own in-flight accounting — fresher than any engine metric.
//
// A decision reads the fields from ID to lapsed of every pod: they come
// first, within one cache line, so a pass over the region's pods reads one
// line per pod. The rest (the next line) is read of the pods it prices.
type Pod struct {
	ID index.PodID

	inflight atomic.Int64 // requests routed here and not finished
	// peerInflight is what the region's other replicas last reported in
	// flight here (Registry.SetPeerLoads), summed over them: InFlight adds
	// it to inflight, and every decision reads both of every pod.
	peerInflight atomic.Int64
	// pendingPrefill and peerPending are read with the rest of the line
	// by the ttft picker's first, cheap bound of a pod (cycle.list).
	pendingPrefill atomic.Int64 // uncached prompt tokens of requests before their first byte
	peerPending    atomic.Int64 // the other replicas' pendingPrefill here, as last reported, summed
	ejectedTo      atomic.Int64 // unix nanos: ejected until then
	// desc is what the filters and scorers need of the pod's PodInfo,
	// worked out when it is announced (see catalog.describe).
	desc   atomic.Uint64
	lapsed atomic.Bool // its announcement ran out and it does not answer

	info          atomic.Pointer[PodInfo]
	factor        atomic.Pointer[podFactor] // the cost model's correction of its rate, as last read
	changes       *atomic.Uint64            // its registry's (Registry.changes); nil outside one
	Name          string
	prefillBusy   atomic.Int64  // unix nanos: when the prefill work routed here should be done (written under backlogMu)
	kvUtil        atomic.Uint64 // float64 bits, 0..1, scraped (vllm:kv_cache_usage_perc or its engine's name)
	outstanding   atomic.Int64  // prompt tokens of requests routed here and not finished
	routed        atomic.Int64  // requests routed here, ever
	engineRunning atomic.Int64  // scraped: requests the engine says it runs (-1: unknown)
	engineWaiting atomic.Int64  // scraped: requests the engine says are queued (-1: unknown)
	contactAt     atomic.Int64  // unix nanos: the pod last answered (a scrape, a request)

	backlogMu sync.Mutex
	shift     int64 // nanos the backlog model has been shifted by first bytes, in all

	mu        sync.Mutex
	fails     int // consecutive 5xx or connection failures
	ejections int // consecutive ejections (the ejection time grows with them)

	// Pad to a size class of whole cache lines, so the hot fields of each
	// pod start a line (TestPodLayout).
	_ [podPad]byte
}

// podFactor is a pod's gorgo.Model.PodFactor as read when the model's
// PodFactorGen was gen.
type podFactor struct {
	gen    uint64
	factor float64
}

// factorAt is m's correction of p's rate, gen being m.PodFactorGen read
// before: the one p keeps from an earlier read while m has published none
// since, so that pricing a pod costs no lookup by name.
func (p *Pod) factorAt(m *gorgo.Model, gen uint64) float64 {
	if f := p.factor.Load(); f != nil && f.gen == gen {
		return f.factor
	}
	f := m.PodFactor(p.Name)
	p.factor.Store(&podFactor{gen: gen, factor: f})
	return f
}

// podPad rounds Pod up to whole cache lines (TestPodLayout).
const podPad = 56

// Info returns the pod's current description.
func (p *Pod) Info() PodInfo { return *p.info.Load() }

// A pod's desc packs its profile's number, its model's number (both in
// the registry's catalog) and whether it has an endpoint.
const (
	descBits     = 24
	descMask     = 1<<descBits - 1
	descEndpoint = 1 << (2 * descBits)
)

func (p *Pod) profile() int { return int(p.desc.Load() & descMask) }

// describe publishes info as the pod's description.
func (p *Pod) describe(cat *catalog, info PodInfo) {
	d := uint64(cat.profile(info.Profile)) | uint64(cat.models[info.Model])<<descBits
	if info.Endpoint != "" {
		d |= descEndpoint
	}
	// Info first: a decision that sees the new desc then reads the new
	// info (it may see the new info with the old desc, as it may see any
	// change land between two reads).
	p.info.Store(&info)
	p.desc.Store(d)
}

// catalog numbers the hardware profile and model names pods have
// announced, so a decision resolves each profile once (not once per pod)
// and compares models as numbers. It is immutable once published; a new
// name publishes a copy (names are few and only ever added).
type catalog struct {
	profiles []string
	byName   map[string]int // profile name -> number
	models   map[string]int // model name -> number; "" is 0
}

func (cat *catalog) profile(name string) int { return cat.byName[name] }

// with returns cat itself when it knows both names, else a copy that does.
func (cat *catalog) with(profile, model string) *catalog {
	_, okP := cat.byName[profile]
	_, okM := cat.models[model]
	if okP && okM {
		return cat
	}
	if len(cat.profiles) >= descMask || len(cat.models) >= descMask {
		panic("route: more than 2^24 distinct profile or model names")
	}
	n := &catalog{profiles: slices.Clone(cat.profiles), byName: maps.Clone(cat.byName), models: maps.Clone(cat.models)}
	if !okP {
		n.byName[profile] = len(n.profiles)
		n.profiles = append(n.profiles, profile)
	}
	if !okM {
		n.models[model] = len(n.models)
	}
	return n
}

// Load is a snapshot of a pod's load.
type Load struct {
	// InFlight is what decisions count (InFlight()): this replica's
	// requests plus the other replicas'.
	InFlight       int64   `json:"in_flight"`
	Own            int64   `json:"own_in_flight"`            // routed by this replica and not finished
	Peers          int64   `json:"peer_in_flight,omitempty"` // the region's other replicas', as last reported
	PendingPrefill int64   `json:"pending_prefill_tokens"`   // uncached tokens of requests before their first byte (this replica's and the others')
	KVUtil         float64 `json:"kv_util"`
	// OutstandingTokens are the prompt tokens of requests routed here and
	// not finished (admitted through Decider.Admit).
	OutstandingTokens int64 `json:"outstanding_tokens"`
	Routed            int64 `json:"routed"`
	// EngineRunning and EngineWaiting are the engine's own scraped counts
	// (-1 when unknown): seconds old, so the decision uses the router's
	// in-flight accounting (precise_prefix, as llm-d does, reads the
	// waiting count); they are shown for operators.
	EngineRunning int64 `json:"engine_running"`
	EngineWaiting int64 `json:"engine_waiting"`
}

// Load returns the pod's current load.
func (p *Pod) Load() Load {
	return Load{
		InFlight:          p.InFlight(),
		Own:               p.inflight.Load(),
		Peers:             p.peerInflight.Load(),
		PendingPrefill:    p.pendingPrefill.Load() + p.peerPending.Load(),
		KVUtil:            math.Float64frombits(p.kvUtil.Load()),
		OutstandingTokens: p.outstanding.Load(),
		Routed:            p.routed.Load(),
		EngineRunning:     p.engineRunning.Load(),
		EngineWaiting:     p.engineWaiting.Load(),
	}
}

// InFlight is the pod's requests in flight as decisions count them: this
// replica's own accounting plus what each of the region's other replicas
// last reported of theirs. A replica's report stands until its next one
// replaces it, and goes only when that replica leaves or is declared dead
// (Registry.ForgetPeer): a late report keeps a pod looking busy, never
// idle. (The engine's own counts, seconds old, are not in it: see Load.)
func (p *Pod) InFlight() int64 {
	return p.inflight.Load() + p.peerInflight.Load()
}

// Admit accounts a request routed to the pod at now with uncached prompt
// tokens whose prefill should take work; the returned ticket must be
// completed exactly once. The pod's prefill backlog is modelled as a FIFO
// queue, as an engine's prefill is compute-bound: the request's work starts
// when the work routed before it is done.
func (p *Pod) Admit(uncached int, work time.Duration, now time.Time) *Ticket {
	p.inflight.Add(1)
	p.pendingPrefill.Add(int64(uncached))
	p.routed.Add(1)
	p.backlogMu.Lock()
	defer p.backlogMu.Unlock()
	done := max(p.prefillBusy.Load(), now.UnixNano()) + int64(work)
	p.prefillBusy.Store(done)
	return &Ticket{pod: p, pending: int64(uncached), due: done, shiftAt: p.shift}
}

// PrefillBacklog is how much prefill work routed to the pod should still be
// ahead of a request arriving at now.
func (p *Pod) PrefillBacklog(now time.Time) time.Duration {
	return time.Duration(max(p.prefillBusy.Load()-now.UnixNano(), 0))
}

// Ticket tracks one admitted request through first byte and completion.
type Ticket struct {
	pod      *Pod
	sessions *Sessions // when the request belongs to a session
	session  string
	pending  int64
	tokens   int64 // prompt tokens counted in the pod's outstanding tokens
	due      int64 // unix nanos: when the backlog model expected its prefill done at admission
	shiftAt  int64 // the pod's shift then
	first    bool
	done     bool
}

// FirstByte marks the end of the request's prefill at now: its tokens leave
// the pending count, and the backlog model learns how far off it was — the
// prefill work routed after this request shifts by the same amount (FIFO).
// The request's expected end is read on the model as already shifted by
// earlier first bytes, so a wave of late requests shifts it once, not once
// per request (which piled up minutes of phantom backlog on idle pods).
func (t *Ticket) FirstByte(now time.Time) {
	if t.first || t.done {
		return
	}
	t.first = true
	p := t.pod
	p.pendingPrefill.Add(-t.pending)
	p.backlogMu.Lock()
	defer p.backlogMu.Unlock()
	delta := now.UnixNano() - (t.due + p.shift - t.shiftAt)
	old := p.prefillBusy.Load()
	if old <= now.UnixNano() && delta < 0 {
		return // drained already
	}
	nv := max(old+delta, now.UnixNano())
	p.prefillBusy.Store(nv)
	p.shift += nv - old
}

// Done marks the request finished at now, successfully or not (a request
// that failed before its first byte leaves the backlog as if its prefill had
// ended then).
func (t *Ticket) Done(now time.Time) {
	if t.done {
		return
	}
	t.FirstByte(now)
	t.done = true
	t.pod.inflight.Add(-1)
	t.pod.outstanding.Add(-t.tokens)
	if t.sessions != nil {
		t.sessions.End(t.session, now)
	}
}

// SetKVUtil records a scraped KV-cache utilisation (0..1).
func (p *Pod) SetKVUtil(u float64) {
	p.kvUtil.Store(math.Float64bits(min(max(u, 0), 1)))
}

// OwnLoad is this replica's own accounting of the pod: its requests in
// flight there and their uncached prompt tokens before the first byte
// (what it reports to the region's other replicas).
func (p *Pod) OwnLoad() (inflight, pendingPrefill int64) {
	return p.inflight.Load(), p.pendingPrefill.Load()
}

// Contact records that the pod answered at now (any HTTP response: it is
// reachable, whatever it said).
func (p *Pod) Contact(now time.Time) {
	n := now.UnixNano()
	for {
		old := p.contactAt.Load()
		if old >= n || p.contactAt.CompareAndSwap(old, n) {
			return
		}
	}
}

// LastContact is when the pod last answered (zero: never).
func (p *Pod) LastContact() time.Time {
	if n := p.contactAt.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Lapsed reports whether the pod's announcement ran out while it did not
// answer: the first phase of its removal. A lapsed pod is no candidate and
// does not count as serving; a new announcement restores it.
func (p *Pod) Lapsed() bool { return p.lapsed.Load() }

// SetLapsed marks the pod lapsed or restores it.
func (p *Pod) SetLapsed(v bool) {
	if p.lapsed.Swap(v) != v && p.changes != nil {
		p.changes.Add(1)
	}
}

// Serving reports whether the pod can take a request at now: it has an
// endpoint, has not lapsed and is not ejected. (Whether it is live in the
// index is the index's to say.)
func (p *Pod) Serving(now time.Time) bool {
	return p.Info().Endpoint != "" && !p.Lapsed() && !p.Ejected(now)
}

// SetEngineQueue records the engine's scraped running and waiting request
// counts (-1: unknown). The waiting count is the signal llm-d's queue
// scorer reads (precise_prefix).
func (p *Pod) SetEngineQueue(running, waiting int64) {
	p.engineRunning.Store(running)
	p.engineWaiting.Store(waiting)
}

// engineQueue is the engine's scraped waiting count, 0 when unknown.
func (p *Pod) engineQueue() int64 { return max(p.engineWaiting.Load(), 0) }

// Ejected reports whether the pod is ejected at now.
func (p *Pod) Ejected(now time.Time) bool { return now.UnixNano() < p.ejectedTo.Load() }

// Registry holds the region's pods. The request path reads an immutable
// snapshot (swapped on every membership change, which is rare), so it never
// takes a lock for membership.
type Registry struct {
	idx   *index.Index
	mu    sync.Mutex
	pods  map[string]*Pod
	snap  atomic.Pointer[[]*Pod]  // sorted by name
	cat   atomic.Pointer[catalog] // replaced under mu
	peers map[string]*peerReport  // the region's other replicas, by id
	// changes counts the changes of what the alive, model and healthy
	// checks read of a pod (its description, lapsing, ejection) and of the
	// snapshot, each counted after it is made: a decision keeps the
	// outcome of the checks while it stands (see eligible).
	changes atomic.Uint64
}

// PeerLoad is one pod's load as another replica of the region accounts
// it: its own requests in flight there and their uncached prompt tokens
// before the first byte.
type PeerLoad struct {
	Pod            string
	InFlight       int64
	PendingPrefill int64
}

type peerReport struct {
	epoch   uint64
	seq     uint64
	at      time.Time
	loads   map[string]PeerLoad
	serving int
}

// PeerReport describes the last report of one of the region's other
// replicas.
type PeerReport struct {
	Peer string    `json:"peer"`
	Seq  uint64    `json:"seq"`
	At   time.Time `json:"at"` // when it arrived, on this replica's clock
	// Pods is the pods it has requests in flight on.
	Pods     int   `json:"pods"`
	InFlight int64 `json:"in_flight"`
	// Serving is the pods it sees able to take a request (live, with an
	// endpoint, not lapsed or ejected); -1: not said (an older replica).
	Serving int `json:"serving"`
}

// NewRegistry builds an empty registry over the region's index.
func NewRegistry(idx *index.Index) *Registry {
	r := &Registry{idx: idx, pods: map[string]*Pod{}, peers: map[string]*peerReport{}}
	empty := []*Pod{}
	r.snap.Store(&empty)
	r.cat.Store(&catalog{byName: map[string]int{}, models: map[string]int{"": 0}})
	return r
}

// catalog returns the current names of profiles and models.
func (r *Registry) catalog() *catalog { return r.cat.Load() }

// describe publishes info as p's description, adding its names to the
// catalog first. Requires r.mu.
func (r *Registry) describe(p *Pod, info PodInfo) {
	cat := r.cat.Load().with(info.Profile, info.Model)
	r.cat.Store(cat)
	p.describe(cat, info)
	r.changes.Add(1)
}

// SetPeerLoads replaces what the replica peer last reported of its own
// accounting with loads (a pod it does not name carries none of its
// requests) and of the pods it sees serving (serving; -1: not said),
// received at now. Reports are ordered by seq within one epoch
// of the replica (a start of its process): a report of the same epoch
// whose seq is not above the last one's is late and ignored (false); one
// of another epoch (the replica restarted) replaces the last whatever its
// seq.
func (r *Registry) SetPeerLoads(peer string, epoch, seq uint64, loads []PeerLoad, serving int, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.peers[peer]; ok && old.epoch == epoch && seq <= old.seq {
		return false
	}
	m := make(map[string]PeerLoad, len(loads))
	for _, l := range loads {
		m[l.Pod] = l
	}
	r.peers[peer] = &peerReport{epoch: epoch, seq: seq, at: now, loads: m, serving: serving}
	r.sumPeersLocked()
	return true
}

// ForgetPeer drops a replica's report: it left the region, or was declared
// dead (its connections, and the requests on them, went with it).
func (r *Registry) ForgetPeer(peer string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.peers[peer]; !ok {
		return
	}
	delete(r.peers, peer)
	r.sumPeersLocked()
}

// PeerReports lists the other replicas' last reports, by peer id.
func (r *Registry) PeerReports() []PeerReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]PeerReport, 0, len(r.peers))
	for id, p := range r.peers {
		pr := PeerReport{Peer: id, Seq: p.seq, At: p.at, Pods: len(p.loads), Serving: p.serving}
		for _, l := range p.loads {
			pr.InFlight += l.InFlight
		}
		out = append(out, pr)
	}
	slices.SortFunc(out, func(a, b PeerReport) int { return strings.Compare(a.Peer, b.Peer) })
	return out
}

// sumPeersLocked sets every pod's peer counters to the sums over the
// replicas' last reports.
func (r *Registry) sumPeersLocked() {
	for name, p := range r.pods {
		var n, pending int64
		for _, rep := range r.peers {
			l := rep.loads[name]
			n += l.InFlight
			pending += l.PendingPrefill
		}
		p.peerInflight.Store(n)
		p.peerPending.Store(pending)
	}
}

// Pods returns the current pods, sorted by name. The slice is shared: do
// not modify it.
func (r *Registry) Pods() []*Pod { return *r.snap.Load() }

// snapshot is Pods as published: one pointer per snapshot.
func (r *Registry) snapshot() *[]*Pod { return r.snap.Load() }

// Get returns a pod by name.
func (r *Registry) Get(name string) (*Pod, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.pods[name]
	return p, ok
}

// Upsert adds a pod or updates its info; the *Pod of a known pod stays the
// same, so its load accounting carries on. A new epoch for a known pod means
// the engine restarted: restarted tells the caller to clear its blocks. An
// announcement with an older epoch than the one known is a replay and
// changes nothing. ErrFull from the index when no slot is free.
func (r *Registry) Upsert(info PodInfo) (p *Pod, restarted bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.pods[info.Name]; ok && r.idx.Alive(old.ID) {
		cur := old.info.Load()
		if info.Epoch != 0 && info.Epoch < cur.Epoch {
			return old, false, nil
		}
		restarted = info.Epoch != 0 && cur.Epoch != 0 && info.Epoch != cur.Epoch
		if *cur != info {
			r.describe(old, info)
		}
		return old, restarted, nil
	}
	id, err := r.idx.AddPod(info.Name)
	if err != nil {
		return nil, false, err
	}
	p = &Pod{Name: info.Name, ID: id, changes: &r.changes}
	p.engineRunning.Store(-1)
	p.engineWaiting.Store(-1)
	r.describe(p, info)
	r.pods[info.Name] = p
	r.sumPeersLocked()
	r.publish()
	return p, false, nil
}

// Remove forgets a pod: it leaves the index at once (its blocks are swept
// later) and is no longer a candidate. Removing an unknown pod is a no-op.
func (r *Registry) Remove(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.pods[name]
	if !ok {
		return
	}
	_ = r.idx.RemovePod(p.ID)
	delete(r.pods, name)
	r.publish()
}

func (r *Registry) publish() {
	s := make([]*Pod, 0, len(r.pods))
	for _, p := range r.pods {
		s = append(s, p)
	}
	slices.SortFunc(s, func(a, b *Pod) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	r.snap.Store(&s)
	r.changes.Add(1)
}
