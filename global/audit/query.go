package audit

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ErrNoKey is returned for a tenant query on a source without the HMAC key.
var ErrNoKey = errors.New("query by tenant needs the audit HMAC key")

// Query selects records. Zero fields select everything.
type Query struct {
	From       time.Time // inclusive
	To         time.Time // exclusive
	Region     string    // matches the origin or the chosen region
	Tenant     string    // raw tenant id: the source compares its HMAC
	Kinds      []Kind    // any of these
	Controller string    // only this controller's chain
	Limit      int       // at most this many records (0: no limit); ignored by Tail
}

// Validate checks the query.
func (q Query) Validate() error {
	if !q.From.IsZero() && !q.To.IsZero() && !q.To.After(q.From) {
		return fmt.Errorf("audit query: to %s is not after from %s", q.To.Format(time.RFC3339Nano), q.From.Format(time.RFC3339Nano))
	}
	for _, k := range q.Kinds {
		if !validKind(k) {
			return fmt.Errorf("audit query: kind %q is not a decision kind", k)
		}
	}
	if q.Controller != "" && !validControllerID(q.Controller) {
		return fmt.Errorf("audit query: controller %q is not a controller id", q.Controller)
	}
	if q.Limit < 0 {
		return fmt.Errorf("audit query: limit %d is negative", q.Limit)
	}
	return nil
}

// Values encodes q as URL query parameters (the HTTP handler's input).
func (q Query) Values() url.Values {
	v := url.Values{}
	if !q.From.IsZero() {
		v.Set("from", q.From.UTC().Format(time.RFC3339Nano))
	}
	if !q.To.IsZero() {
		v.Set("to", q.To.UTC().Format(time.RFC3339Nano))
	}
	if q.Region != "" {
		v.Set("region", q.Region)
	}
	if q.Tenant != "" {
		v.Set("tenant", q.Tenant)
	}
	for _, k := range q.Kinds {
		v.Add("kind", string(k))
	}
	if q.Controller != "" {
		v.Set("controller", q.Controller)
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v
}

// ParseQuery decodes URL query parameters written by Query.Values; errors
// name the parameter.
func ParseQuery(v url.Values) (Query, error) {
	var q Query
	var err error
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"from", &q.From}, {"to", &q.To}} {
		if s := v.Get(p.name); s != "" {
			if *p.dst, err = time.Parse(time.RFC3339Nano, s); err != nil {
				return Query{}, fmt.Errorf("audit query: %s %q is not an RFC 3339 time", p.name, s)
			}
		}
	}
	q.Region, q.Tenant, q.Controller = v.Get("region"), v.Get("tenant"), v.Get("controller")
	for _, k := range v["kind"] {
		for _, part := range strings.Split(k, ",") {
			if part = strings.TrimSpace(part); part != "" {
				q.Kinds = append(q.Kinds, Kind(part))
			}
		}
	}
	if s := v.Get("limit"); s != "" {
		if q.Limit, err = strconv.Atoi(s); err != nil {
			return Query{}, fmt.Errorf("audit query: limit %q is not a number", s)
		}
	}
	return q, q.Validate()
}

// Cursor yields records one at a time; Next returns io.EOF at the end.
type Cursor interface {
	Next() (Record, error)
	Close() error
}

// Source is where queries read records from: a directory (DirSource), a live
// Log, a controller over HTTP (HTTPSource), or several of them (Multi).
type Source interface {
	// Query returns the matching records ordered by (time, controller, seq).
	Query(ctx context.Context, q Query) (Cursor, error)
	// Tail returns the matching records appended from now on; Next blocks
	// until one arrives and returns ctx.Err() when ctx ends (io.EOF if the
	// source is closed).
	Tail(ctx context.Context, q Query) (Cursor, error)
}

// matcher applies a query's filters (all but time and limit) to records.
type matcher struct {
	q       Query
	tenantH string
	kinds   map[Kind]bool
}

func newMatcher(q Query, h *Hasher) (*matcher, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	m := &matcher{q: q}
	if q.Tenant != "" {
		if h == nil {
			return nil, ErrNoKey
		}
		m.tenantH = h.Tenant(q.Tenant)
	}
	if len(q.Kinds) > 0 {
		m.kinds = map[Kind]bool{}
		for _, k := range q.Kinds {
			m.kinds[k] = true
		}
	}
	return m, nil
}

func (m *matcher) match(r *Record) bool {
	q := &m.q
	switch {
	case !q.From.IsZero() && r.Time.Before(q.From):
		return false
	case !q.To.IsZero() && !r.Time.Before(q.To):
		return false
	case q.Region != "" && r.Origin != q.Region && r.Region != q.Region:
		return false
	case m.tenantH != "" && r.TenantHMAC != m.tenantH:
		return false
	case m.kinds != nil && !m.kinds[r.Kind]:
		return false
	case q.Controller != "" && r.Controller != q.Controller:
		return false
	}
	return true
}

// DirSource reads an audit directory: a root holding one directory per
// controller, or a single controller's directory.
type DirSource struct {
	Dir          string
	Hasher       *Hasher       // for tenant queries; nil refuses them with ErrNoKey
	PollInterval time.Duration // how often Tail looks for new records; default 500ms

	live *Log // set for a Log's own source: read only durable records, wake on commit
}

// Source returns a Source over this log that sees only durable records and
// whose Tail wakes on each commit. A *Log is itself a Source through it.
func (l *Log) Source() *DirSource { return &DirSource{Dir: l.dir, Hasher: l.hasher, live: l} }

// Query implements Source (durable records of this log only).
func (l *Log) Query(ctx context.Context, q Query) (Cursor, error) { return l.Source().Query(ctx, q) }

// Tail implements Source.
func (l *Log) Tail(ctx context.Context, q Query) (Cursor, error) { return l.Source().Tail(ctx, q) }

// visible returns the read limit for a segment (-1: whole file) and whether
// it may be read at all.
func (s *DirSource) visible(st *commitState, seg string) (int64, bool) {
	if st == nil {
		return -1, true
	}
	switch c := cmp.Compare(seg, st.segment); {
	case c < 0:
		return -1, true
	case c == 0:
		return st.off, true
	}
	return 0, false
}

func (s *DirSource) chains(q Query) ([]chainDir, error) {
	cds, err := listChains(s.Dir)
	if err != nil {
		return nil, fmt.Errorf("audit query %s: %w", s.Dir, err)
	}
	if q.Controller != "" {
		cds = slices.DeleteFunc(cds, func(cd chainDir) bool { return cd.controller != q.Controller })
	}
	return cds, nil
}

// Query implements Source. It seeks each segment with its sparse index
// (checking the entry it uses against the segment) and stops a chain at
// the first record at or after q.To.
func (s *DirSource) Query(ctx context.Context, q Query) (Cursor, error) {
	m, err := newMatcher(q, s.Hasher)
	if err != nil {
		return nil, err
	}
	cds, err := s.chains(q)
	if err != nil {
		return nil, err
	}
	st := s.state()
	var curs []Cursor
	for _, cd := range cds {
		segs, err := listSegments(cd.dir)
		if err != nil {
			return nil, fmt.Errorf("audit query %s: %w", cd.dir, err)
		}
		curs = append(curs, &chainCursor{ctx: ctx, src: s, st: st, dir: cd.dir, segs: segs, m: m})
	}
	return newMerge(curs, q.Limit), nil
}

// chainCursor reads one controller's chain in order.
type chainCursor struct {
	ctx     context.Context
	src     *DirSource
	st      *commitState
	dir     string
	segs    []segFile
	m       *matcher
	lr      *lineReader
	done    bool
	scratch []byte
}

func (c *chainCursor) Next() (Record, error) {
	for !c.done {
		if err := c.ctx.Err(); err != nil {
			return Record{}, err
		}
		if c.lr == nil {
			if len(c.segs) == 0 {
				c.done = true
				break
			}
			seg := c.segs[0]
			c.segs = c.segs[1:]
			if err := c.open(seg); err != nil {
				return Record{}, err
			}
			continue
		}
		line, off, _, err := c.lr.next()
		if err == io.EOF {
			c.lr.close()
			c.lr = nil
			continue
		}
		if err != nil {
			return Record{}, fmt.Errorf("audit query: read %s: %w", c.lr.f.Name(), err)
		}
		var r Record
		if err := decodeRecord(line, &r); err != nil {
			return Record{}, fmt.Errorf("audit query: %s offset %d: not a record: %w", c.lr.f.Name(), off, err)
		}
		if !c.m.q.To.IsZero() && !r.Time.Before(c.m.q.To) {
			c.done = true // times never decrease along a chain
			break
		}
		if c.m.match(&r) {
			return r, nil
		}
	}
	c.Close()
	return Record{}, io.EOF
}

// open positions the cursor in seg: past every record before q.From that
// the sparse index lets it skip.
func (c *chainCursor) open(seg segFile) error {
	limit, ok := c.src.visible(c.st, seg.name)
	if !ok {
		c.segs = nil
		return nil
	}
	path := filepath.Join(c.dir, seg.name)
	start := int64(0)
	if from := c.m.q.From; !from.IsZero() {
		entries, seal := readIndex(filepath.Join(c.dir, indexName(seg.name)))
		if seal != nil && limit < 0 && seal.Off == seg.size && seal.TS < from.UnixNano() && c.sealValid(path, entries, *seal) {
			return nil // the whole segment is older than from
		}
		// The last entry before from: every record before it is older.
		i := sort.Search(len(entries), func(i int) bool { return entries[i].TS >= from.UnixNano() }) - 1
		for ; i >= 0; i-- {
			if indexEntryValid(path, entries[i], &c.scratch) && (limit < 0 || entries[i].Off < limit) {
				start = entries[i].Off
				break
			}
		}
	}
	lr, err := openLines(path, start, limit)
	if errors.Is(err, os.ErrNotExist) {
		return nil // removed since listing
	}
	if err != nil {
		return fmt.Errorf("audit query: %w", err)
	}
	c.lr = lr
	return nil
}

// sealValid checks a seal against the segment: the last indexed record and
// everything after it must end with the sealed record at the sealed size.
func (c *chainCursor) sealValid(path string, entries []indexEntry, seal indexEntry) bool {
	start := int64(0)
	if n := len(entries); n > 0 {
		if indexEntryValid(path, entries[n-1], &c.scratch) {
			start = entries[n-1].Off
		}
	}
	lr, err := openLines(path, start, -1)
	if err != nil {
		return false
	}
	defer lr.close()
	var last Record
	end := int64(-1)
	for {
		line, off, torn, err := lr.next()
		if err != nil {
			if err == io.EOF && len(torn) == 0 {
				end = off
			}
			break
		}
		if decodeRecord(line, &last) != nil {
			return false
		}
	}
	return end == seal.Off && last.Seq == seal.Seq && last.Hash == seal.Hash && last.Time.UnixNano() == seal.TS
}

func (c *chainCursor) Close() error {
	c.done = true
	if c.lr != nil {
		err := c.lr.close()
		c.lr = nil
		return err
	}
	return nil
}

// merge yields the records of several cursors ordered by (time,
// controller, seq); each cursor must already be in that order.
type merge struct {
	h     mergeHeap
	curs  []Cursor
	init  bool
	limit int
	n     int
}

func newMerge(curs []Cursor, limit int) *merge { return &merge{curs: curs, limit: limit} }

type mergeItem struct {
	r Record
	c Cursor
}

type mergeHeap []mergeItem

func (h mergeHeap) Len() int      { return len(h) }
func (h mergeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h mergeHeap) Less(i, j int) bool {
	return recordOrder(&h[i].r, &h[j].r) < 0
}
func (h *mergeHeap) Push(x any) { *h = append(*h, x.(mergeItem)) }
func (h *mergeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// recordOrder is the order of query results: time, then controller, then seq.
func recordOrder(a, b *Record) int {
	return cmp.Or(a.Time.Compare(b.Time), cmp.Compare(a.Controller, b.Controller), cmp.Compare(a.Seq, b.Seq))
}

func (m *merge) Next() (Record, error) {
	if !m.init {
		m.init = true
		for _, c := range m.curs {
			r, err := c.Next()
			if err == io.EOF {
				continue
			}
			if err != nil {
				return Record{}, err
			}
			m.h = append(m.h, mergeItem{r, c})
		}
		heap.Init(&m.h)
	}
	if len(m.h) == 0 || (m.limit > 0 && m.n >= m.limit) {
		return Record{}, io.EOF
	}
	it := m.h[0]
	r, err := it.c.Next()
	switch {
	case err == io.EOF:
		heap.Pop(&m.h)
	case err != nil:
		return Record{}, err
	default:
		m.h[0].r = r
		heap.Fix(&m.h, 0)
	}
	m.n++
	return it.r, nil
}

func (m *merge) Close() error {
	var errs []error
	for _, c := range m.curs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// NaiveQuery is the reference for Query: it reads every record of every
// segment under dir, filters, sorts by (time, controller, seq) and cuts at
// the limit. It uses neither the sparse index nor the time order.
func NaiveQuery(dir string, q Query, h *Hasher) ([]Record, error) {
	m, err := newMatcher(q, h)
	if err != nil {
		return nil, err
	}
	cds, err := listChains(dir)
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, cd := range cds {
		segs, err := listSegments(cd.dir)
		if err != nil {
			return nil, err
		}
		for _, seg := range segs {
			b, err := os.ReadFile(filepath.Join(cd.dir, seg.name))
			if err != nil {
				return nil, err
			}
			for _, line := range strings.Split(string(b), "\n") {
				if line == "" {
					continue
				}
				var r Record
				if err := decodeRecord([]byte(line), &r); err != nil {
					return nil, err
				}
				if m.match(&r) {
					out = append(out, r)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Record) int { return recordOrder(&a, &b) })
	if q.Limit > 0 && len(out) > q.Limit {
		out = out[:q.Limit]
	}
	return out, nil
}

// Collect drains a cursor.
func Collect(c Cursor) ([]Record, error) {
	defer c.Close()
	var out []Record
	for {
		r, err := c.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
}
