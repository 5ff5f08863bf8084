package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Tail implements Source: it starts at the current end of every chain (a
// controller directory that appears later is read from its start) and
// follows new segments. A directory written by another process is polled
// every PollInterval; a Log's own source wakes on each commit and returns
// io.EOF once the log is closed.
func (s *DirSource) Tail(ctx context.Context, q Query) (Cursor, error) {
	m, err := newMatcher(q, s.Hasher)
	if err != nil {
		return nil, err
	}
	t := &tailCursor{ctx: ctx, src: s, m: m, pos: map[string]*tailPos{}}
	cds, err := s.chains(q)
	if err != nil {
		return nil, err
	}
	st := s.state()
	for _, cd := range cds {
		segs, err := listSegments(cd.dir)
		if err != nil {
			return nil, fmt.Errorf("audit tail %s: %w", cd.dir, err)
		}
		p := &tailPos{dir: cd.dir}
		for i := len(segs) - 1; i >= 0; i-- {
			limit, ok := s.visible(st, segs[i].name)
			if !ok {
				continue
			}
			p.seg = segs[i].name
			if limit >= 0 {
				p.off = limit
			} else if p.off, err = completeEnd(filepath.Join(cd.dir, segs[i].name), segs[i].size); err != nil {
				return nil, fmt.Errorf("audit tail: %w", err)
			}
			break
		}
		t.pos[cd.controller] = p
	}
	return t, nil
}

func (s *DirSource) state() *commitState {
	if s.live == nil {
		return nil
	}
	return s.live.state.Load()
}

type tailPos struct {
	dir string
	seg string // "" before the first segment
	off int64
}

type tailCursor struct {
	ctx     context.Context
	src     *DirSource
	m       *matcher
	pos     map[string]*tailPos
	pending []Record
	closed  bool
}

func (t *tailCursor) Next() (Record, error) {
	for {
		if t.closed {
			return Record{}, io.EOF
		}
		if len(t.pending) > 0 {
			r := t.pending[0]
			t.pending = t.pending[1:]
			return r, nil
		}
		if err := t.ctx.Err(); err != nil {
			return Record{}, err
		}
		st := t.src.state() // before polling: its notify covers any later commit
		if err := t.poll(st); err != nil {
			return Record{}, err
		}
		if len(t.pending) > 0 {
			continue
		}
		if err := t.wait(st); err != nil {
			return Record{}, err
		}
	}
}

func (t *tailCursor) wait(st *commitState) error {
	if st != nil {
		if t.src.live.closedNow() {
			return io.EOF
		}
		select {
		case <-st.notify:
			return nil
		case <-t.ctx.Done():
			return t.ctx.Err()
		}
	}
	d := t.src.PollInterval
	if d <= 0 {
		d = 500 * time.Millisecond
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-t.ctx.Done():
		return t.ctx.Err()
	}
}

// poll reads every complete new line of every chain.
func (t *tailCursor) poll(st *commitState) error {
	cds, err := t.src.chains(t.m.q)
	if err != nil {
		return err
	}
	for _, cd := range cds {
		p := t.pos[cd.controller]
		if p == nil {
			p = &tailPos{dir: cd.dir}
			t.pos[cd.controller] = p
		}
		if err := t.pollChain(p, st); err != nil {
			return err
		}
	}
	slices.SortStableFunc(t.pending, func(a, b Record) int { return recordOrder(&a, &b) })
	return nil
}

func (t *tailCursor) pollChain(p *tailPos, st *commitState) error {
	for {
		if p.seg != "" {
			limit, ok := t.src.visible(st, p.seg)
			if !ok {
				return nil
			}
			if err := t.read(p, limit); err != nil {
				return err
			}
		}
		segs, err := listSegments(p.dir)
		if err != nil {
			return fmt.Errorf("audit tail %s: %w", p.dir, err)
		}
		i := slices.IndexFunc(segs, func(s segFile) bool { return s.name > p.seg })
		if i < 0 {
			return nil
		}
		if _, ok := t.src.visible(st, segs[i].name); !ok {
			return nil
		}
		p.seg, p.off = segs[i].name, 0
	}
}

func (t *tailCursor) read(p *tailPos, limit int64) error {
	lr, err := openLines(filepath.Join(p.dir, p.seg), p.off, limit)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("audit tail: %w", err)
	}
	defer lr.close()
	for {
		line, off, _, err := lr.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("audit tail: read %s: %w", p.seg, err)
		}
		var r Record
		if err := decodeRecord(line, &r); err != nil {
			return fmt.Errorf("audit tail: %s offset %d: not a record: %w", p.seg, off, err)
		}
		p.off = off + int64(len(line)) + 1
		if t.m.match(&r) {
			t.pending = append(t.pending, r)
		}
	}
}

func (t *tailCursor) Close() error {
	t.closed = true
	return nil
}

// completeEnd returns the offset just past the last newline of the file
// (size bytes long): where the next complete line will start.
func completeEnd(path string, size int64) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	const chunk = 64 << 10
	buf := make([]byte, chunk)
	for end := size; end > 0; {
		start := max(0, end-chunk)
		n, err := f.ReadAt(buf[:end-start], start)
		if err != nil && err != io.EOF {
			return 0, err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			return start + int64(i) + 1, nil
		}
		end = start
	}
	return 0, nil
}
