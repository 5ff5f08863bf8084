package sim

import (
	"time"

	"github.com/meridian-llm/meridian/regional/route"
)

// scheduleFailure fails Workload.FailRegion's pods over its window of the
// arrivals' span.
func (w *world) scheduleFailure() {
	wl := &w.cfg.Workload
	if wl.FailRegion == "" {
		return
	}
	var r *region
	for _, x := range w.regions {
		if x.name == wl.FailRegion {
			r = x
		}
	}
	h := w.src.horizon()
	w.at(time.Duration(float64(h)*wl.FailFrom), func() { w.fail(r) })
	w.at(time.Duration(float64(h)*wl.FailTo), func() { w.recover(r) })
}

// fail takes every pod of r down: they leave its registry and index (their
// caches are lost; what they run finishes), the other regions see r not
// live, and requests entering r go elsewhere.
func (w *world) fail(r *region) {
	r.failed = true
	for _, p := range r.pods {
		p.epoch++
		r.reg.Remove(p.spec.name)
	}
	w.setLive(r, false)
}

// recover brings r's pods back, cold.
func (w *world) recover(r *region) {
	for _, p := range r.pods {
		rp, _, err := r.reg.Upsert(route.PodInfo{Name: p.spec.name, Profile: p.spec.profile, Endpoint: "sim://" + p.spec.name, Static: true})
		if err != nil {
			w.stats.indexErrors++
			continue
		}
		p.epoch++
		p.rp = rp
		if p.cache != w.pool {
			p.cache = newKVCache(p.spec.capBlocks, w.kvEvents(p))
		}
	}
	r.failed = false
	w.setLive(r, true)
}

// setLive marks r live or not in every other region's view.
func (w *world) setLive(r *region, live bool) {
	for _, o := range w.regions {
		if o.view == nil {
			continue
		}
		for i := range o.view.Regions {
			if v := &o.view.Regions[i]; v.Region == r.name {
				v.Live = live
			}
		}
	}
}
