package discovery

import (
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func namedPods(names ...string) []Pod {
	pods := make([]Pod, 0, len(names))
	for _, n := range names {
		pods = append(pods, Pod{Name: n, Endpoint: "http://" + n + ":8000"})
	}
	return pods
}

func podNames(pods []Pod) string {
	var s []string
	for _, p := range pods {
		s = append(s, p.Name)
	}
	return strings.Join(s, ",")
}

// TestTracker drives the keep-or-drop rule with answers at given times:
// each step is the answer's arrival (seconds after t0), its pods, and the
// published set after it.
func TestTracker(t *testing.T) {
	type step struct {
		at      int // seconds after t0
		answer  string
		want    string
		changed bool
	}
	for _, tc := range []struct {
		name   string
		grace  time.Duration
		misses int
		steps  []step
	}{
		{"joins at once", 30 * time.Second, 2, []step{
			{0, "", "", false},
			{5, "a,b", "a,b", true},
			{10, "a,b,c", "a,b,c", true},
			{15, "a,b,c", "a,b,c", false},
		}},
		{"one flap is not a drop", 30 * time.Second, 2, []step{
			{0, "a,b", "a,b", true},
			{5, "a", "a,b", false},
			{10, "a,b", "a,b", false},
			// The count started again: one more miss long after is one miss.
			{100, "a", "a,b", false},
			{105, "a,b", "a,b", false},
		}},
		{"dropped after misses and grace", 30 * time.Second, 2, []step{
			{0, "a,b", "a,b", true},
			{5, "a", "a,b", false},
			{10, "a", "a,b", false},  // two misses, 5s of grace
			{34, "a", "a,b", false},  // 29s
			{35, "a", "a", true},     // 30s
			{40, "a,b", "a,b", true}, // back: a join
		}},
		{"grace without enough misses keeps it", 30 * time.Second, 3, []step{
			{0, "a,b", "a,b", true},
			{5, "a", "a,b", false},
			{600, "a", "a,b", false}, // after an outage of lookups: 2 misses
			{605, "a", "a", true},
		}},
		{"everything gone, slowly", 10 * time.Second, 2, []step{
			{0, "a,b,c", "a,b,c", true},
			{1, "", "a,b,c", false},
			{2, "b", "a,b,c", false},
			{11, "", "b", true}, // a and c: 10s, 3 misses; b: 1 miss
			{12, "", "b", false},
			{21, "", "", true},
		}},
		{"no grace, one miss", 0, 1, []step{
			{0, "a,b", "a,b", true},
			{0, "b", "b", true},
			{0, "", "", true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTracker(tc.grace, tc.misses)
			for i, s := range tc.steps {
				var answer []Pod
				if s.answer != "" {
					answer = namedPods(strings.Split(s.answer, ",")...)
				}
				changed := tr.observe(t0.Add(time.Duration(s.at)*time.Second), answer)
				if got := podNames(tr.snapshot()); got != s.want || changed != s.changed {
					t.Fatalf("step %d (t=%ds, answer %q): published %q changed %v, want %q changed %v",
						i, s.at, s.answer, got, changed, s.want, s.changed)
				}
			}
		})
	}
}

func TestTrackerUpdatesAChangedPod(t *testing.T) {
	tr := newTracker(time.Minute, 2)
	tr.observe(t0, namedPods("a"))
	tr.observe(t0.Add(time.Second), nil) // a is missing once
	moved := Pod{Name: "a", Endpoint: "http://10.0.0.9:8000"}
	if !tr.observe(t0.Add(2*time.Second), []Pod{moved}) {
		t.Fatal("a pod whose endpoint changed did not change the set")
	}
	if got := tr.snapshot(); !slices.Equal(got, []Pod{moved}) {
		t.Fatalf("snapshot %v, want %v", got, moved)
	}
	if n := tr.missing(); n != 0 {
		t.Fatalf("missing %d after the pod came back, want 0", n)
	}
}
