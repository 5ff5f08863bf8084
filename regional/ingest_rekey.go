package regional

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/regional/kvevents"
)

// reserve sizes a pod's re-keyer for its KV capacity: kvBlocks (from its
// PodUp, its kv-blocks header or its static configuration), else the
// configured KVBlocksPerPod; nothing when neither is known.
func (g *Ingester) reserve(rk *kvevents.Rekeyer, kvBlocks uint64) {
	n := int(min(kvBlocks, uint64(g.cfg.MaxEntriesPerPod)))
	if n == 0 {
		n = g.cfg.KVBlocksPerPod
	}
	if n > 0 {
		rk.Reserve(n)
	}
}

// rekeyStats sums the re-keyers' counters, of live pods and retired ones.
func (g *Ingester) rekeyStats() kvevents.RekeyStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.retired
	for _, ps := range g.pods {
		s = s.Add(ps.rekey.Stats())
	}
	return s
}

// rekeyCollector exports what the re-keyers skipped, by reason: storage a
// pod does not own, groups that are not full attention, content the chain
// cannot express, parents and media it does not know, and the cap.
type rekeyCollector struct {
	g    *Ingester
	desc *prometheus.Desc
}

func (c *rekeyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *rekeyCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.g.rekeyStats()
	for _, r := range []struct {
		reason string
		n      uint64
	}{
		{"non_local", s.NonLocal}, {"not_full_attention", s.NotFullAttention}, {"opaque", s.Opaque},
		{"unknown_parent", s.UnknownParent}, {"unknown_medium", s.UnknownMedium}, {"bad_blocks", s.BadBlocks},
		{"bad_rank", s.BadRank}, {"conflict", s.Conflicts}, {"cap_evicted", s.CapEvicted}, {"cap_dropped", s.CapDropped},
		{"reannounced", s.Reannounced},
	} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(r.n), r.reason)
	}
}
