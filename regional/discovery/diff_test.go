package discovery

import (
	"cmp"
	"net/netip"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// naiveDiff is the reference for Diff: for every pod, look for its name in
// the other snapshot by scanning it. Snapshots have unique names.
func naiveDiff(prev, next []Pod) Delta {
	find := func(pods []Pod, name string) (Pod, bool) {
		for _, p := range pods {
			if p.Name == name {
				return p, true
			}
		}
		return Pod{}, false
	}
	var d Delta
	for _, n := range next {
		if p, ok := find(prev, n.Name); !ok {
			d.Joined = append(d.Joined, n)
		} else if p != n {
			d.Changed = append(d.Changed, n)
		}
	}
	for _, p := range prev {
		if _, ok := find(next, p.Name); !ok {
			d.Left = append(d.Left, p)
		}
	}
	byName := func(a, b Pod) int { return cmp.Compare(a.Name, b.Name) }
	slices.SortFunc(d.Joined, byName)
	slices.SortFunc(d.Changed, byName)
	slices.SortFunc(d.Left, byName)
	return d
}

// apply turns prev into the snapshot that d leads to.
func apply(prev []Pod, d Delta) []Pod {
	m := map[string]Pod{}
	for _, p := range prev {
		m[p.Name] = p
	}
	for _, p := range d.Left {
		delete(m, p.Name)
	}
	for _, p := range append(slices.Clone(d.Joined), d.Changed...) {
		m[p.Name] = p
	}
	var out []Pod
	for _, p := range m {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Pod) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// genSnapshot draws a snapshot from few names and few values, so that two
// snapshots share names and values often.
func genSnapshot(t *rapid.T, label string) []Pod {
	names := rapid.SliceOfNDistinct(rapid.SampledFrom([]string{"a", "b", "c", "d", "e", "f", "g", "h"}), 0, 8,
		rapid.ID[string]).Draw(t, label)
	slices.Sort(names)
	pods := make([]Pod, 0, len(names))
	for _, n := range names {
		ip := rapid.IntRange(1, 2).Draw(t, label+"-ip-"+n)
		pods = append(pods, Pod{Name: n, Endpoint: "http://" + n, Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(ip)}),
			Model: rapid.SampledFrom([]string{"", "m"}).Draw(t, label+"-model-"+n)})
	}
	return pods
}

func sameDelta(a, b Delta) bool {
	return slices.Equal(a.Joined, b.Joined) && slices.Equal(a.Changed, b.Changed) && slices.Equal(a.Left, b.Left)
}

func TestDiffMatchesNaive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		prev, next := genSnapshot(t, "prev"), genSnapshot(t, "next")
		got, want := Diff(prev, next), naiveDiff(prev, next)
		if !sameDelta(got, want) {
			t.Fatalf("Diff(%v, %v)\n = %+v\nnaive %+v", prev, next, got, want)
		}
		if back := apply(prev, got); !slices.Equal(back, next) {
			t.Fatalf("applying %+v to %v gives %v, want %v", got, prev, back, next)
		}
		if got.Empty() != slices.Equal(prev, next) {
			t.Fatalf("Empty() = %v for %v -> %v", got.Empty(), prev, next)
		}
	})
}

// Diff of unsorted slices with repeated names sorts copies and takes the
// last pod of each name, leaving its arguments as they were.
func TestDiffUnsorted(t *testing.T) {
	prev := []Pod{{Name: "c"}, {Name: "a", Model: "old"}, {Name: "a", Model: "m"}}
	next := []Pod{{Name: "b"}, {Name: "a", Model: "m"}}
	keep := slices.Clone(prev)
	d := Diff(prev, next)
	want := Delta{Joined: []Pod{{Name: "b"}}, Left: []Pod{{Name: "c"}}}
	if !sameDelta(d, want) {
		t.Fatalf("Diff = %+v, want %+v", d, want)
	}
	if !slices.Equal(prev, keep) {
		t.Fatalf("Diff changed its argument: %v", prev)
	}
}
