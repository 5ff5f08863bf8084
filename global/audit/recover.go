package audit

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// recover finds the chain head in the last segment holding records, repairs
// an incomplete last line (cut and kept aside in a .torn file), completes
// that segment's index and seal, and opens the segment to write next: the
// empty last segment if there is one that continues the chain, else a new one.
func (l *Log) recover() error {
	segs, err := listSegments(l.dir)
	if err != nil {
		return err
	}
	l.head = chainHead{hash: genesisPrev}
	var reuse *segFile
	var headSeg string
	var headCount uint64
	for i := len(segs) - 1; i >= 0; i-- {
		s := segs[i]
		count, head, err := l.recoverSegment(s)
		if err != nil {
			return err
		}
		if count > 0 {
			l.head, headSeg, headCount = head, s.name, count
			break
		}
		if i == len(segs)-1 {
			reuse = &segs[i]
		}
	}
	now := l.clock.Now()
	if reuse != nil && reuse.first == l.head.seq+1 {
		path := filepath.Join(l.dir, reuse.name)
		f, err := l.fs.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		idx, err := l.fs.OpenFile(filepath.Join(l.dir, indexName(reuse.name)), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o640)
		if err != nil {
			l.logger.Warn("audit index create failed; readers of this segment will scan", "segment", reuse.name, "err", err)
			idx = nil
		}
		l.seg = &activeSegment{name: reuse.name, first: reuse.first, f: f, idx: idx, created: now}
	} else {
		if reuse != nil {
			return &CorruptError{Segment: filepath.Join(l.dir, reuse.name), Line: 1,
				Reason: fmt.Sprintf("empty last segment does not continue the chain (head is seq %d)", l.head.seq)}
		}
		if l.seg, err = l.createSegment(now); err != nil {
			return err
		}
	}
	l.seg.headSeg, l.seg.headCount = headSeg, headCount
	return nil
}

// recoverSegment checks the tail of one segment (from its last index entry
// that is still right) and returns its record count and last record. An
// incomplete last line is cut and saved to <segment>.torn.
func (l *Log) recoverSegment(s segFile) (uint64, chainHead, error) {
	path := filepath.Join(l.dir, s.name)
	idxPath := filepath.Join(l.dir, indexName(s.name))
	entries, seal := readIndex(idxPath)
	start, expect := int64(0), s.first
	keep := 0
	var scratch []byte
	for j := len(entries) - 1; j >= 0; j-- {
		if indexEntryValid(path, entries[j], &scratch) {
			start, expect, keep = entries[j].Off, entries[j].Seq, j+1
			break
		}
	}
	entries = entries[:keep]
	lr, err := openLines(path, start, -1)
	if err != nil {
		return 0, chainHead{}, err
	}
	defer lr.close()
	var head chainHead
	prev := ""
	line := int(expect - s.first) // lines before start, when the segment is valid
	sinceIndex := uint64(0)
	if keep > 0 {
		sinceIndex = entries[keep-1].Seq
	}
	var torn []byte
	var end int64
	for {
		b, off, t, err := lr.next()
		if err == io.EOF {
			torn, end = t, off
			break
		}
		if err != nil {
			return 0, chainHead{}, err
		}
		line++
		var c lineCheck
		c, scratch = checkLine(b, scratch)
		bad := func(reason string) error {
			return &CorruptError{Segment: path, Line: line, Reason: reason}
		}
		switch {
		case !c.hashOK:
			return 0, chainHead{}, bad(c.problem)
		case c.rec.Controller != l.cfg.ControllerID:
			return 0, chainHead{}, bad(fmt.Sprintf("record of controller %q", c.rec.Controller))
		case c.rec.Seq != expect:
			return 0, chainHead{}, bad(fmt.Sprintf("seq %d, want %d", c.rec.Seq, expect))
		case prev != "" && c.rec.Prev != prev:
			return 0, chainHead{}, bad(fmt.Sprintf("seq %d does not chain to seq %d", c.rec.Seq, c.rec.Seq-1))
		}
		if seq := c.rec.Seq; (seq-s.first)%uint64(l.cfg.IndexEvery) == 0 && seq > sinceIndex {
			entries = append(entries, indexEntry{Seq: seq, TS: c.rec.Time.UnixNano(), Off: off})
		}
		prev = c.rec.Hash
		head = chainHead{seq: c.rec.Seq, hash: c.rec.Hash, ts: c.rec.Time}
		expect++
	}
	if len(torn) > 0 {
		if err := l.cutTorn(path, end, torn); err != nil {
			return 0, chainHead{}, err
		}
	}
	if head.seq == 0 {
		return 0, head, nil
	}
	count := head.seq - s.first + 1
	want := indexEntry{Seq: head.seq, TS: head.ts.UnixNano(), Off: end, Seal: true, Count: count, Hash: head.hash}
	if seal == nil || *seal != want || keep != len(entries) {
		if err := l.rewriteIndex(idxPath, append(entries, want)); err != nil {
			l.logger.Warn("audit index rebuild failed; readers of this segment will scan", "segment", s.name, "err", err)
		}
	}
	return count, head, nil
}

// indexEntryValid reports whether the segment holds a valid record with the
// entry's seq at the entry's offset.
func indexEntryValid(path string, e indexEntry, scratch *[]byte) bool {
	lr, err := openLines(path, e.Off, -1)
	if err != nil {
		return false
	}
	defer lr.close()
	b, _, _, err := lr.next()
	if err != nil {
		return false
	}
	var c lineCheck
	c, *scratch = checkLine(b, *scratch)
	return c.hashOK && c.rec.Seq == e.Seq && c.rec.Time.UnixNano() == e.TS
}

// cutTorn saves an incomplete last line to <segment>.torn and cuts it off.
// The line was never acknowledged: its batch did not finish its fsync.
func (l *Log) cutTorn(path string, off int64, torn []byte) error {
	l.logger.Warn("audit segment ends with an incomplete line; cutting it", "segment", path, "offset", off, "bytes", len(torn))
	tf, err := l.fs.OpenFile(path+tornExt, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	_, werr := fmt.Fprintf(tf, "offset %d: %q\n", off, torn)
	if werr == nil {
		werr = tf.Sync()
	}
	if err := tf.Close(); werr == nil {
		werr = err
	}
	if werr != nil {
		return werr
	}
	f, err := l.fs.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	err = f.Truncate(off)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (l *Log) rewriteIndex(path string, entries []indexEntry) error {
	var b []byte
	for _, e := range entries {
		b = appendIndexEntry(b, e)
	}
	tmp := path + ".tmp"
	f, err := l.fs.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return l.fs.Rename(tmp, path)
}
