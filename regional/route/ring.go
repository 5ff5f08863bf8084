package route

import (
	"math"
	"slices"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// hashRing is the consistent-hash ring of the bounded_affinity picker:
// each pod owns round(virtualNodes x its prefill speed / the slowest pod's)
// points, sorted by hash. It is immutable once built, for one registry
// snapshot and the pods' profiles then; the naive reference in its tests
// sorts and scans every point for each pick.
type hashRing struct {
	pods     []*Pod   // the registry snapshot it was built for
	profiles []string // their profiles then
	points   []ringPoint
}

type ringPoint struct {
	hash uint64
	pod  *Pod
}

// ringHash places keys and points on the ring.
func ringHash(s string) uint64 { return xxhash.Sum64String(s) }

func newHashRing(pods []*Pod, d *Decider, virtualNodes int) *hashRing {
	r := &hashRing{pods: pods, profiles: make([]string, len(pods))}
	slowest := math.Inf(1)
	for i, p := range pods {
		r.profiles[i] = p.Info().Profile
		slowest = min(slowest, d.speed(p))
	}
	for _, p := range pods {
		n := max(1, int(math.Round(float64(virtualNodes)*d.speed(p)/slowest)))
		for i := range n {
			r.points = append(r.points, ringPoint{hash: ringHash(p.Name + "#" + strconv.Itoa(i)), pod: p})
		}
	}
	slices.SortFunc(r.points, comparePoints)
	return r
}

// comparePoints orders points by hash, then by pod name (a collision of
// two points' hashes must not make the order depend on insertion).
func comparePoints(a, b ringPoint) int {
	switch {
	case a.hash < b.hash:
		return -1
	case a.hash > b.hash:
		return 1
	case a.pod.Name < b.pod.Name:
		return -1
	case a.pod.Name > b.pod.Name:
		return 1
	}
	return 0
}

// builtFor reports whether the ring is the one for this snapshot of pods:
// the same snapshot (the registry swaps it on any membership change) with
// the same profiles.
func (r *hashRing) builtFor(pods []*Pod, d *Decider) bool {
	if r == nil || len(pods) != len(r.pods) || (len(pods) > 0 && &pods[0] != &r.pods[0]) {
		return false
	}
	for i, p := range pods {
		if p.Info().Profile != r.profiles[i] {
			return false
		}
	}
	return true
}

// pick walks the ring clockwise from the key's hash to the first point
// whose pod is a candidate under its load bound. There is always one: the
// bounds of the candidates sum to at least factor x (total + 1) > total.
// Should rounding ever leave none, the first candidate met is taken.
func (r *hashRing) pick(c *cycle, key string, factor float64) int {
	var total int64
	var sum float64
	for _, p := range c.pods {
		total += p.InFlight()
		sum += c.speedOf(p)
	}
	// candidate index by pod slot: c.speed holds speeds by slot; a scratch
	// map keeps this allocation-light for the usual few hundred pods.
	at := make(map[*Pod]int, len(c.pods))
	for i, p := range c.pods {
		at[p] = i
	}
	h := ringHash(key)
	start, _ := slices.BinarySearchFunc(r.points, h, func(p ringPoint, h uint64) int {
		switch {
		case p.hash < h:
			return -1
		case p.hash > h:
			return 1
		}
		return 0
	})
	first := -1
	for k := range r.points {
		pt := r.points[(start+k)%len(r.points)]
		i, ok := at[pt.pod]
		if !ok {
			continue
		}
		if first < 0 {
			first = i
		}
		if pt.pod.InFlight()+1 <= loadBound(factor, total, c.speedOf(pt.pod), sum) {
			return i
		}
	}
	if first < 0 {
		return 0 // a candidate the snapshot does not hold (cannot happen: candidates come from it)
	}
	return first
}
