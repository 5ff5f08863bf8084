package residency

// Globs in a policy use two wildcards: '*' matches any run of characters
// (including none) and '?' matches exactly one character. No other character
// is special, and there is no escape. Tenant and data-class values are drawn
// from a fixed alphabet (validValue), so a pattern holding a character outside
// it can never match and is reported by Validate.

// MaxValueLen is the longest tenant or data-class value Evaluate accepts; a
// longer one is malformed (and fails closed where a rule looks at it).
const MaxValueLen = 256

func isGlob(p string) bool {
	for i := 0; i < len(p); i++ {
		if p[i] == '*' || p[i] == '?' {
			return true
		}
	}
	return false
}

// valueByte reports whether c may appear in a tenant or data-class value.
func valueByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	switch c {
	case '-', '_', '.', ':', '@', '/', '+':
		return true
	}
	return false
}

// validValue reports whether v is a well-formed tenant or data-class value:
// 1 to MaxValueLen bytes of the value alphabet.
func validValue(v string) bool {
	if len(v) == 0 || len(v) > MaxValueLen {
		return false
	}
	for i := 0; i < len(v); i++ {
		if !valueByte(v[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// globMatch reports whether s matches pattern p. With fold, ASCII letters
// compare case-insensitively. It never allocates.
func globMatch(p, s string, fold bool) bool { return glob(p, s, fold, false) }

// globCovers reports whether every string matched by b is matched by a. It is
// sound (true means covered) but not complete: it treats b's wildcards as
// symbols that a must match, where b's '*' is matched only by a's '*' and b's
// '?' by a's '?' or '*'. Patterns are compared as given (callers lower-case
// data-class patterns first).
func globCovers(a, b string) bool { return glob(a, b, false, true) }

// glob matches s against pattern p with the classic two-pointer algorithm
// that backtracks only to the last '*'. With fold, ASCII letters compare
// case-insensitively; with symbolic, s's '*' is a symbol only p's '*' can
// stand for (s's '?' is matched by p's '?' or '*' either way).
func glob(p, s string, fold, symbolic bool) bool {
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		if pi < len(p) {
			switch c, d := p[pi], s[si]; {
			case c == '*':
				star, mark = pi, si
				pi++
				continue
			case symbolic && d == '*':
				// only p's '*' can stand for s's '*'
			case c == '?' || c == d || (fold && lower(c) == lower(d)):
				pi++
				si++
				continue
			}
		}
		if star < 0 {
			return false
		}
		pi = star + 1
		mark++
		si = mark
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// globIntersect reports whether some non-empty string of the value alphabet
// matches both a and b, and returns the shortest-path witness it found. It is
// exact for '*'/'?' patterns: a dynamic program over pattern positions.
func globIntersect(a, b string) (string, bool) {
	n, m := len(a), len(b)
	// ok[i][j]: a[i:] and b[j:] have a common match.
	ok := make([]bool, (n+1)*(m+1))
	at := func(i, j int) int { return i*(m+1) + j }
	for i := n; i >= 0; i-- {
		for j := m; j >= 0; j-- {
			var v bool
			switch {
			case i == n && j == m:
				v = true
			case i < n && a[i] == '*':
				// '*' matches nothing, or absorbs one character of b[j]
				// (a literal or '?'), or b's '*' matches nothing.
				v = ok[at(i+1, j)] || (j < m && ok[at(i, j+1)])
			case j < m && b[j] == '*':
				v = ok[at(i, j+1)] || (i < n && ok[at(i+1, j)])
			case i < n && j < m:
				v = (a[i] == '?' || b[j] == '?' || a[i] == b[j]) && ok[at(i+1, j+1)]
			}
			ok[at(i, j)] = v
		}
	}
	if !ok[at(0, 0)] {
		return "", false
	}
	// Walk one successful path to build a witness, preferring to consume
	// characters so '*' versus '*' still yields a non-empty value.
	var w []byte
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] != '*' && b[j] != '*':
			c := a[i]
			if c == '?' {
				c = b[j]
			}
			if c == '?' {
				c = 'x'
			}
			w = append(w, c)
			i++
			j++
		case i < n && a[i] == '*' && j < m && b[j] != '*' && ok[at(i, j+1)]:
			c := b[j]
			if c == '?' {
				c = 'x'
			}
			w = append(w, c)
			j++
		case j < m && b[j] == '*' && i < n && a[i] != '*' && ok[at(i+1, j)]:
			c := a[i]
			if c == '?' {
				c = 'x'
			}
			w = append(w, c)
			i++
		case i < n && a[i] == '*' && ok[at(i+1, j)]:
			i++
		default: // j < m && b[j] == '*' && ok[at(i, j+1)]
			j++
		}
	}
	if len(w) == 0 {
		// Only stars on both sides: any single character matches both.
		w = append(w, 'x')
	}
	return string(w), true
}
