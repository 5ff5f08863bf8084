package route

import (
	"time"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/index"
)

// cycle is the working state of one decision: the request, the pods still
// in the running, and what the data layer found about them. The pipeline's
// stages read and narrow it in turn. A Decider keeps cycles in a pool, so a
// decision allocates none of this.
type cycle struct {
	d       *Decider
	req     *Request
	now     time.Time
	matches []index.Match
	touched []int   // slots whose bySlot a speculation raised
	bySlot  []int32 // matched blocks per pod slot (index, or speculation)
	speed   []float64
	speeds  bool   // speed holds the candidates' speeds
	pods    []*Pod // the candidates, narrowed by each filter
	pin     struct {
		pod      string
		inflight int
		ok       bool
	}
	filtered map[string]int // pods each filter dropped (nil: none)

	// The ttft picker's working set: the candidates as the cost model
	// sees them, in the order they were offered to it.
	order []*Pod
	rates []float64 // prefill ms per token of order[i]'s profile, now
	cands []gorgo.Candidate
	dec   gorgo.Decision
}

func newCycle(capacity int) *cycle {
	return &cycle{matches: make([]index.Match, 0, capacity), bySlot: make([]int32, capacity),
		speed: make([]float64, capacity)}
}

// begin fills the data layer: the longest cached prefix of every pod (from
// the index, raised by a fresher speculation) and the session's pin.
func (c *cycle) begin(d *Decider, req *Request, pods []*Pod, now time.Time) {
	c.d, c.req, c.now = d, req, now
	c.speeds, c.filtered = false, nil
	c.matches = d.idx.Lookup(req.Chain, c.matches)
	for _, m := range c.matches {
		c.bySlot[m.Pod.Slot()] = int32(m.Blocks)
	}
	c.touched = c.touched[:0]
	var confirmed []index.PodID
	d.spec.Match(req.Chain, now, func(id index.PodID, blocks int) {
		slot := id.Slot()
		switch {
		case !d.idx.Alive(id):
		case int32(blocks) > c.bySlot[slot]:
			c.bySlot[slot] = int32(blocks)
			c.touched = append(c.touched, slot)
		default:
			confirmed = append(confirmed, id) // the index caught up
		}
	})
	for _, id := range confirmed {
		d.spec.Confirmed(id, req.Chain[:c.bySlot[id.Slot()]])
	}
	c.pin.pod, c.pin.inflight, c.pin.ok = d.sessions.Pinned(req.SessionID, now)
	c.pods = append(c.pods[:0], pods...)
}

// end clears what begin set in the per-slot tables, for the next decision.
func (c *cycle) end() {
	for _, m := range c.matches {
		c.bySlot[m.Pod.Slot()] = 0
	}
	for _, slot := range c.touched {
		c.bySlot[slot] = 0
	}
	c.d, c.req = nil, nil
}

// matched is the number of leading blocks of the request's chain pod holds.
func (c *cycle) matched(p *Pod) int { return int(c.bySlot[p.ID.Slot()]) }

// cached is the prompt tokens pod holds, before any tier weighting.
func (c *cycle) cached(p *Pod) int { return min(c.matched(p)*c.req.BlockSize, c.req.PromptTokens) }

// speedOf is p's relative prefill speed (tokens per ms at its profile's
// nominal rate), computed for every candidate the first time one is asked.
func (c *cycle) speedOf(p *Pod) float64 {
	if !c.speeds {
		for _, q := range c.pods {
			c.speed[q.ID.Slot()] = c.d.speed(q)
		}
		c.speeds = true
	}
	return c.speed[p.ID.Slot()]
}

// keep narrows the candidates to those ok accepts, counting the others
// under the filter's name.
func (c *cycle) keep(name string, ok func(*Pod) bool) {
	n := 0
	for _, p := range c.pods {
		if ok(p) {
			c.pods[n] = p
			n++
		}
	}
	if n < len(c.pods) {
		if c.filtered == nil {
			c.filtered = map[string]int{}
		}
		c.filtered[name] += len(c.pods) - n
	}
	c.pods = c.pods[:n]
}

// speed is a pod's relative prefill speed: tokens per ms at its profile's
// nominal rate (not the calibrated one, which moves with load and noise and
// would make the bounds built on it move).
func (d *Decider) speed(p *Pod) float64 {
	rate := d.model.Nominal(p.Info().Profile).PrefillMsPerToken
	if rate <= 0 {
		return 1
	}
	return 1 / rate
}
