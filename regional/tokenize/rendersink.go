package tokenize

import "unsafe"

// renderSink is where a chat template writes its rendering. Rendered
// against a reference encoding (the session's previous turn, the prefix
// cache's last entry), it compares what it is given with the reference's
// text for as long as the two agree, without copying it, and keeps only
// the rendering from the last restart point of the reference that the
// agreement makes safe to reuse (Extend's rule: its special token starts
// at least maxSpecial bytes before the first difference) on. So a request
// that repeats an 11 KB system prompt costs a compare of it, not a copy,
// and nothing after it is scanned or hashed again. Without a reference it
// keeps the whole rendering.
//
// The rendering is then the reference's text up to that point followed by
// the sink's own tail (finish). TestRenderSinkMatchesRender holds it to the
// plain rendering; the tail is a copy, so nothing written (message contents
// borrowed from a request body) is kept.
type renderSink struct {
	ref        *Encoding // nil: keep everything
	maxI       int       // the highest restart of ref that may be reused
	maxSpecial int
	est        int // the rendering's estimated length

	matching bool
	k, off   int // while matching: ref.text[k].s[off:] comes next
	shared   int // bytes that agreed with ref's text
	cut      int // the restart of ref reused (-1: none), once not matching
	from     int // where buf starts in the rendering: the end of cut, or 0
	buf      []byte
}

// reset starts a rendering against ref (nil: none), reusing at most its
// restart maxI, of about est bytes.
func (w *renderSink) reset(ref *Encoding, maxI, maxSpecial, est int) {
	*w = renderSink{ref: ref, maxI: maxI, maxSpecial: maxSpecial, est: est, cut: -1, matching: ref != nil}
}

// rewind forgets what was written, to render again.
func (w *renderSink) rewind() {
	w.reset(w.ref, w.maxI, w.maxSpecial, w.est)
}

// WriteString appends s to the rendering.
func (w *renderSink) WriteString(s string) {
	for w.matching {
		if len(s) == 0 {
			return
		}
		if w.k == len(w.ref.text) {
			w.stop()
			break
		}
		p := w.ref.text[w.k].s[w.off:]
		n := min(len(p), len(s))
		if p[:n] != s[:n] {
			n = commonPrefix(p[:n], s[:n])
			w.shared += n
			s = s[n:]
			w.stop()
			break
		}
		w.shared += n
		w.off += n
		s = s[n:]
		if n == len(p) {
			w.k++
			w.off = 0
		}
	}
	if w.buf == nil {
		w.buf = make([]byte, 0, max(w.est, len(s)))
	}
	w.buf = append(w.buf, s...)
}

// stop ends the comparison: the rendering and ref's text agree on their
// first shared bytes, no more. It picks the restart to reuse and copies
// ref's text after it up to there.
func (w *renderSink) stop() {
	w.matching = false
	rs := w.ref.restarts
	for i := min(w.maxI, len(rs)-1); i >= 0; i-- {
		if rs[i].start+w.maxSpecial <= w.shared {
			w.cut, w.from = i, rs[i].end
			break
		}
	}
	w.buf = make([]byte, 0, max(w.est-w.from, w.shared-w.from+64))
	w.buf = appendText(w.buf, w.ref.text, w.from, w.shared)
}

// finish ends the rendering and returns the restart of ref reused (-1:
// none) and the rendering after it (all of it when none). The sink must
// not be written to after.
func (w *renderSink) finish() (cut int, tail textPiece) {
	if w.matching {
		w.stop()
	}
	return w.cut, textPiece{s: unsafe.String(unsafe.SliceData(w.buf), len(w.buf)), whole: cap(w.buf)}
}
