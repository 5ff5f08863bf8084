package reqbody

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"pgregory.net/rapid"
)

func TestClass(t *testing.T) {
	for _, tc := range []struct {
		n, class int
		ok       bool
	}{{1, 0, true}, {4096, 0, true}, {4097, 1, true}, {8192, 1, true}, {8193, 2, true},
		{1 << 20, 8, true}, {1<<20 + 1, 0, false}} {
		c, ok := class(tc.n)
		if ok != tc.ok || (ok && c != tc.class) {
			t.Errorf("class(%d) = %d, %v; want %d, %v", tc.n, c, ok, tc.class, tc.ok)
		}
	}
}

// TestReadLikeReadAll: whatever the declared length (right, short, long,
// unknown) and however the reader splits the body, Read reads what
// io.ReadAll reads, pooled or not, and fails as it does.
func TestReadLikeReadAll(t *testing.T) {
	bp := &Pool{Poison: true}
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 3<<20).Draw(t, "n")
		if rapid.Bool().Draw(t, "small") {
			n = rapid.IntRange(0, 20000).Draw(t, "small_n")
		}
		body := bytes.Repeat([]byte{byte(n)}, n)
		copy(body, fmt.Sprint(n))
		length := int64(n)
		switch rapid.IntRange(0, 3).Draw(t, "declared") {
		case 1:
			length = -1 // unknown (chunked)
		case 2:
			length = int64(rapid.IntRange(1, n+1).Draw(t, "declared_short")) // a reader longer than declared
		case 3:
			length = int64(n + rapid.IntRange(1, 5000).Draw(t, "declared_long"))
		}
		max := int64(4 << 20)
		kind, fails := rapid.IntRange(0, 2).Draw(t, "reader"), rapid.Bool().Draw(t, "fails")
		mk := func() io.Reader {
			var r io.Reader = bytes.NewReader(body)
			switch kind {
			case 1:
				r = iotest.OneByteReader(io.LimitReader(r, 5000)) // slow, then cut short
			case 2:
				r = iotest.HalfReader(r)
			}
			if fails {
				r = io.MultiReader(r, iotest.ErrReader(errors.New("broken")))
			}
			return r
		}
		want, wantErr := io.ReadAll(mk())
		got, err := Read(mk(), length, max, bp)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("err %v, want %v", err, wantErr)
		}
		if err != nil {
			if got.buf != nil || got.Len() != 0 {
				t.Fatal("a failed read kept its buffer")
			}
			return
		}
		if !bytes.Equal(got.Borrow(), want) {
			t.Fatalf("read %d bytes, want %d", got.Len(), len(want))
		}
		if got.buf != nil && len(want) > 0 && &(*got.buf)[:1][0] != &got.Borrow()[:1][0] {
			t.Fatal("the pooled buffer is not the one read into")
		}
		got.Release()
	})
}

// readPooled reads s into a pooled Body of bp.
func readPooled(t *testing.T, bp *Pool, s string) Body {
	t.Helper()
	b, err := Read(strings.NewReader(s), int64(len(s)), 1<<20, bp)
	if err != nil || !b.Pooled() {
		t.Fatalf("read: %v, pooled %v", err, b.Pooled())
	}
	return b
}

// TestKeptBodySurvivesRelease: bytes taken with Keep read as they were
// after the Body is released and the pool has handed out (and poisoned)
// buffers again; bytes borrowed read the poison once the Body is released,
// which is what a keeper handed borrowed bytes would read (the mark lost):
// the poison hook catches it.
func TestKeptBodySurvivesRelease(t *testing.T) {
	bp := &Pool{Poison: true}
	const s = `{"model":"m","messages":[{"role":"user","content":"kept"}]}`

	kept := readPooled(t, bp, s)
	k := kept.Keep()
	if kept.Pooled() {
		t.Fatal("a kept body still goes back to its pool")
	}
	kept.Release()
	for i := 0; i < 4; i++ {
		other := readPooled(t, bp, strings.Repeat("x", len(s)))
		other.Release()
	}
	if string(k) != s {
		t.Fatalf("kept bytes changed after release: %q", k)
	}

	borrowed := readPooled(t, bp, s)
	bb := borrowed.Borrow()
	borrowed.Release()
	if !bytes.Equal(bb, bytes.Repeat([]byte{0xee}, len(s))) {
		t.Fatalf("borrowed bytes after release read %q, want the poison", bb)
	}
	borrowed.Release() // twice: harmless

	// Rewriting keeps the buffer read into until Release.
	rw := readPooled(t, bp, s)
	orig := rw.Borrow()
	rw.Rewrite(func(b []byte) []byte { return append([]byte(nil), b[:10]...) })
	if string(rw.Borrow()) != s[:10] || !rw.Pooled() || string(orig) != s {
		t.Fatalf("rewritten: %q, pooled %v, original %q", rw.Borrow(), rw.Pooled(), orig)
	}
	rw.Release()
	if orig[0] != 0xee {
		t.Fatal("a rewritten body's buffer was not given back")
	}

	if u := Of([]byte(s)); u.Pooled() || string(u.Keep()) != s {
		t.Fatal("Of: pooled, or not its bytes")
	}
}
