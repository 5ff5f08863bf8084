package discovery

import (
	"maps"
	"slices"
	"time"
)

// tracker turns a sequence of answers into the set of pods a source
// publishes, keeping a pod that an answer lacks until it has been missing
// from misses consecutive answers and for grace since the first of them.
// It is a pure state machine: the caller gives each answer and the time it
// arrived, and owns the goroutine, the resolver and the clock.
type tracker struct {
	grace  time.Duration
	misses int
	pods   map[string]*tracked
}

// tracked is one pod the tracker publishes.
type tracked struct {
	pod    Pod
	missed int       // consecutive answers without it
	since  time.Time // arrival of the first of them (when missed > 0)
}

func newTracker(grace time.Duration, misses int) *tracker {
	return &tracker{grace: grace, misses: max(misses, 1), pods: map[string]*tracked{}}
}

// observe applies one answer (pods with unique names) that arrived at now,
// and reports whether the published set changed.
func (t *tracker) observe(now time.Time, answer []Pod) (changed bool) {
	present := make(map[string]bool, len(answer))
	for _, p := range answer {
		present[p.Name] = true
		tp, ok := t.pods[p.Name]
		switch {
		case !ok:
			t.pods[p.Name] = &tracked{pod: p}
			changed = true
		case tp.pod != p:
			tp.pod = p
			changed = true
		}
		if ok {
			tp.missed = 0
		}
	}
	for name, tp := range t.pods {
		if present[name] {
			continue
		}
		tp.missed++
		if tp.missed == 1 {
			tp.since = now
		}
		if tp.missed >= t.misses && now.Sub(tp.since) >= t.grace {
			delete(t.pods, name)
			changed = true
		}
	}
	return changed
}

// snapshot returns the published pods, sorted by name.
func (t *tracker) snapshot() []Pod {
	out := make([]Pod, 0, len(t.pods))
	for _, name := range slices.Sorted(maps.Keys(t.pods)) {
		out = append(out, t.pods[name].pod)
	}
	return out
}

// missing returns how many published pods the last answer lacked.
func (t *tracker) missing() int {
	n := 0
	for _, tp := range t.pods {
		if tp.missed > 0 {
			n++
		}
	}
	return n
}
