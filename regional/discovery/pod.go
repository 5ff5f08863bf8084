package discovery

import (
	"cmp"
	"net/netip"
	"slices"
)

// Pod is one inference pod as a source found it. It is comparable: two
// values differ exactly when something a consumer acts on changed.
type Pod struct {
	// Name identifies the pod: the registry's name in a controller, the
	// Kafka key and pod header in the bridge.
	Name string `json:"name"`
	// Endpoint is the base URL of its OpenAI-compatible API, e.g.
	// "http://10.0.3.7:8000".
	Endpoint string `json:"endpoint"`
	// Model and Profile (hardware profile for gorgo) as configured.
	Model   string `json:"model,omitempty"`
	Profile string `json:"profile,omitempty"`
	// Addr is the pod's IP address: always for the DNS source, for the file
	// source when the endpoint's host is an IP literal.
	Addr netip.Addr `json:"addr,omitzero"`
	// KVEvents is the engine's ZMQ PUB endpoint (tcp://<ip>:<port>) when a
	// port or an endpoint is configured; empty otherwise.
	KVEvents string `json:"kv_events,omitempty"`
	// Replay is the engine's ZMQ ROUTER replay endpoint, likewise.
	Replay string `json:"replay,omitempty"`
}

// Delta is how one snapshot of pods differs from the one before. Each list
// is sorted by name.
type Delta struct {
	Joined  []Pod // in the new snapshot only
	Changed []Pod // in both, with a different value (the new one)
	Left    []Pod // in the old snapshot only (the old value)
}

// Empty reports whether the snapshots were the same.
func (d Delta) Empty() bool { return len(d.Joined)+len(d.Changed)+len(d.Left) == 0 }

// Diff compares two snapshots. A snapshot from a Source is sorted by name
// with unique names, and Diff then walks both once; other slices are
// sorted first (copies: the arguments are not modified), and of pods with
// the same name only the last counts.
func Diff(prev, next []Pod) Delta {
	prev, next = normalise(prev), normalise(next)
	var d Delta
	i, j := 0, 0
	for i < len(prev) || j < len(next) {
		switch {
		case j == len(next) || i < len(prev) && prev[i].Name < next[j].Name:
			d.Left = append(d.Left, prev[i])
			i++
		case i == len(prev) || next[j].Name < prev[i].Name:
			d.Joined = append(d.Joined, next[j])
			j++
		default:
			if prev[i] != next[j] {
				d.Changed = append(d.Changed, next[j])
			}
			i++
			j++
		}
	}
	return d
}

// normalise returns pods sorted by name with unique names (the last of
// each name), copying only when pods is not already so.
func normalise(pods []Pod) []Pod {
	strictly := func(pods []Pod) bool {
		for i := 1; i < len(pods); i++ {
			if pods[i-1].Name >= pods[i].Name {
				return false
			}
		}
		return true
	}
	if strictly(pods) {
		return pods
	}
	s := slices.Clone(pods)
	slices.SortStableFunc(s, func(a, b Pod) int { return cmp.Compare(a.Name, b.Name) })
	out := s[:0]
	for i, p := range s {
		if i+1 < len(s) && s[i+1].Name == p.Name {
			continue // a later pod of the same name wins
		}
		out = append(out, p)
	}
	return out
}
