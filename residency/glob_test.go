package residency

import (
	"testing"

	"pgregory.net/rapid"
)

func TestGlobMatch(t *testing.T) {
	cases := []struct {
		p, s string
		fold bool
		want bool
	}{
		{"acme", "acme", false, true},
		{"acme", "acm", false, false},
		{"acme-*", "acme-", false, true},
		{"acme-*", "acme-eu", false, true},
		{"*-eu", "acme-eu", false, true},
		{"a?me", "acme", false, true},
		{"a?me", "ame", false, false},
		{"*", "", false, true},
		{"a*b*c", "aXbYbZc", false, true},
		{"a*b*c", "aXbYbZ", false, false},
		{"PHI", "phi", true, true},
		{"PHI", "phi", false, false},
		{"p*", "PII", true, true},
	}
	for _, c := range cases {
		if got := globMatch(c.p, c.s, c.fold); got != c.want {
			t.Errorf("globMatch(%q, %q, %v) = %v", c.p, c.s, c.fold, got)
		}
	}
}

var globAlphabet = []rune("ab*?")

func genGlob(t *rapid.T, label string) string {
	return string(rapid.SliceOfN(rapid.SampledFrom(globAlphabet), 0, 6).Draw(t, label))
}

// allStrings returns every string over "ab" of length at most n.
func allStrings(n int) []string {
	out := []string{""}
	frontier := []string{""}
	for range n {
		var next []string
		for _, s := range frontier {
			next = append(next, s+"a", s+"b")
		}
		out = append(out, next...)
		frontier = next
	}
	return out
}

// TestGlobMatchMatchesRegexp compares the two-pointer matcher with the
// regular-expression reference.
func TestGlobMatchMatchesRegexp(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := genGlob(t, "pattern")
		s := string(rapid.SliceOfN(rapid.SampledFrom([]rune("abAB")), 0, 8).Draw(t, "s"))
		fold := rapid.Bool().Draw(t, "fold")
		if got, want := globMatch(p, s, fold), refGlob(p, s, fold); got != want {
			t.Fatalf("globMatch(%q, %q, %v) = %v, reference %v", p, s, fold, got, want)
		}
	})
}

// TestGlobCoversIsSound: when globCovers(a, b), every string b matches (up to
// a length covering every pattern of the test) a matches too.
func TestGlobCoversIsSound(t *testing.T) {
	strs := allStrings(8)
	rapid.Check(t, func(t *rapid.T) {
		a, b := genGlob(t, "a"), genGlob(t, "b")
		if !globCovers(a, b) {
			return
		}
		for _, s := range strs {
			if globMatch(b, s, false) && !globMatch(a, s, false) {
				t.Fatalf("globCovers(%q, %q) but %q matches only the second", a, b, s)
			}
		}
	})
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"*", "acme", true}, {"acme-*", "acme-eu", true}, {"acme-*", "acme-*-x", true},
		{"a?me", "acme", true}, {"acme", "a?me", false}, {"a*", "*a", false}, {"*", "*", true},
	} {
		if got := globCovers(c.a, c.b); got != c.want {
			t.Errorf("globCovers(%q, %q) = %v", c.a, c.b, got)
		}
	}
}

// TestGlobIntersectIsExact compares with a brute-force search, and checks
// that the witness matches both patterns.
func TestGlobIntersectIsExact(t *testing.T) {
	strs := allStrings(12) // a shortest common match is at most len(a)+len(b) long
	rapid.Check(t, func(t *rapid.T) {
		a := genGlob(t, "a")
		b := genGlob(t, "b")
		if a == "" || b == "" {
			return // patterns are never empty (Validate reports them)
		}
		brute := false
		for _, s := range strs {
			if s != "" && globMatch(a, s, false) && globMatch(b, s, false) {
				brute = true
				break
			}
		}
		w, ok := globIntersect(a, b)
		if ok != brute {
			t.Fatalf("globIntersect(%q, %q) = %v, brute force %v", a, b, ok, brute)
		}
		if ok && (w == "" || !globMatch(a, w, false) || !globMatch(b, w, false)) {
			t.Fatalf("witness %q does not match both %q and %q", w, a, b)
		}
	})
}
