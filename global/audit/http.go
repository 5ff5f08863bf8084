package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Handler serves a Source over HTTP as JSON Lines (one canonical record per
// line), for the controller to mount under its authenticated admin prefix:
//
//	GET <prefix>/query?from=&to=&region=&tenant=&kind=&controller=&limit=
//	GET <prefix>/tail?region=&tenant=&kind=&controller=
//
// Times are RFC 3339; kind may repeat or be comma-separated; tenant is the
// raw id (the source HMACs it). A bad parameter is a 400 with a JSON
// {"error": ...}; an error after the first record ends the stream with such
// a line. Tail flushes each record and ends when the client goes away.
func Handler(src Source) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /query", func(w http.ResponseWriter, r *http.Request) {
		serveCursor(w, r, src.Query, false)
	})
	mux.HandleFunc("GET /tail", func(w http.ResponseWriter, r *http.Request) {
		serveCursor(w, r, src.Tail, true)
	})
	return mux
}

type openFunc func(context.Context, Query) (Cursor, error)

func serveCursor(w http.ResponseWriter, r *http.Request, open openFunc, flush bool) {
	q, err := ParseQuery(r.URL.Query())
	if err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	cur, err := open(r.Context(), q)
	if err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, ErrNoKey) {
			code = http.StatusBadRequest
		}
		httpError(w, code, err)
		return
	}
	defer cur.Close()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	if flush && fl != nil {
		fl.Flush() // let the client see the headers before the first record
	}
	bw := bufio.NewWriter(w)
	var buf []byte
	for {
		rec, err := cur.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if r.Context().Err() == nil {
				writeErrorLine(bw, err)
			}
			break
		}
		if buf, err = rec.AppendCanonical(buf[:0]); err != nil {
			writeErrorLine(bw, err)
			break
		}
		buf = append(buf, '\n')
		if _, err := bw.Write(buf); err != nil {
			return
		}
		if flush {
			if bw.Flush() != nil {
				return
			}
			if fl != nil {
				fl.Flush()
			}
		}
	}
	_ = bw.Flush()
}

type errorLine struct {
	Error string `json:"error"`
}

func writeErrorLine(w io.Writer, err error) {
	b, _ := json.Marshal(errorLine{Error: err.Error()})
	_, _ = w.Write(append(b, '\n'))
}

func httpError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	writeErrorLine(w, err)
}

// HTTPSource reads a controller's audit Handler: the Source that a fan-out
// over all controllers merges (see Multi).
type HTTPSource struct {
	BaseURL string       // where Handler is mounted, e.g. http://127.0.0.1:7070/admin/audit
	Client  *http.Client // nil: http.DefaultClient
	Token   string       // bearer token for the admin endpoints, if any
}

// Query implements Source.
func (h *HTTPSource) Query(ctx context.Context, q Query) (Cursor, error) {
	return h.open(ctx, "query", q)
}

// Tail implements Source.
func (h *HTTPSource) Tail(ctx context.Context, q Query) (Cursor, error) {
	return h.open(ctx, "tail", q)
}

func (h *HTTPSource) open(ctx context.Context, op string, q Query) (Cursor, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	u := strings.TrimSuffix(h.BaseURL, "/") + "/" + op
	if v := q.Values().Encode(); v != "" {
		u += "?" + v
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("audit %s %s: %w", op, h.BaseURL, err)
	}
	if h.Token != "" {
		req.Header.Set("Authorization", "Bearer "+h.Token)
	}
	client := h.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("audit %s %s: %w", op, h.BaseURL, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		var el errorLine
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &el) == nil && el.Error != "" {
			msg = el.Error
		}
		return nil, fmt.Errorf("audit %s %s: %s: %s", op, h.BaseURL, resp.Status, msg)
	}
	return &httpCursor{body: resp.Body, r: bufio.NewReaderSize(resp.Body, 64<<10), ctx: ctx, where: h.BaseURL}, nil
}

type httpCursor struct {
	body  io.ReadCloser
	r     *bufio.Reader
	ctx   context.Context
	where string
	once  sync.Once
}

func (c *httpCursor) Next() (Record, error) {
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		if cerr := c.ctx.Err(); cerr != nil {
			return Record{}, cerr
		}
		if err == io.EOF && len(line) == 0 {
			return Record{}, io.EOF
		}
		return Record{}, fmt.Errorf("audit read %s: %w", c.where, err)
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	if bytes.HasPrefix(line, []byte(`{"error":`)) {
		var el errorLine
		_ = json.Unmarshal(line, &el)
		return Record{}, fmt.Errorf("audit read %s: %s", c.where, el.Error)
	}
	var r Record
	if err := decodeRecord(line, &r); err != nil {
		return Record{}, fmt.Errorf("audit read %s: not a record: %w", c.where, err)
	}
	return r, nil
}

func (c *httpCursor) Close() error {
	var err error
	c.once.Do(func() { err = c.body.Close() })
	return err
}

// Multi is a Source over several sources (for example one HTTPSource per
// controller): Query merges their results by (time, controller, seq); Tail
// interleaves their new records as they arrive.
type Multi []Source

// Query implements Source.
func (m Multi) Query(ctx context.Context, q Query) (Cursor, error) {
	curs := make([]Cursor, 0, len(m))
	for _, s := range m {
		c, err := s.Query(ctx, q)
		if err != nil {
			for _, c := range curs {
				c.Close()
			}
			return nil, err
		}
		curs = append(curs, c)
	}
	return newMerge(curs, q.Limit), nil
}

// Tail implements Source. It runs one goroutine per source, owned by the
// returned cursor: Close (or the end of ctx) stops them and waits.
func (m Multi) Tail(ctx context.Context, q Query) (Cursor, error) {
	ctx, cancel := context.WithCancel(ctx)
	curs := make([]Cursor, 0, len(m))
	for _, s := range m {
		c, err := s.Tail(ctx, q)
		if err != nil {
			cancel()
			for _, c := range curs {
				c.Close()
			}
			return nil, err
		}
		curs = append(curs, c)
	}
	mt := &multiTail{ctx: ctx, cancel: cancel, out: make(chan tailItem), live: len(curs)}
	for _, c := range curs {
		mt.wg.Add(1)
		go mt.pump(c)
	}
	return mt, nil
}

type tailItem struct {
	r   Record
	err error
}

type multiTail struct {
	ctx    context.Context
	cancel context.CancelFunc
	out    chan tailItem
	live   int // sources that have not ended
	wg     sync.WaitGroup
	once   sync.Once
}

func (mt *multiTail) pump(c Cursor) {
	defer mt.wg.Done()
	defer c.Close()
	for {
		r, err := c.Next()
		select {
		case mt.out <- tailItem{r, err}:
		case <-mt.ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// Next returns the next record of any source; io.EOF once every source has
// ended, and the first other error (which stops the rest).
func (mt *multiTail) Next() (Record, error) {
	for mt.live > 0 {
		select {
		case it := <-mt.out:
			switch {
			case it.err == io.EOF:
				mt.live--
				continue
			case it.err != nil:
				mt.cancel()
			}
			return it.r, it.err
		case <-mt.ctx.Done():
			return Record{}, mt.ctx.Err()
		}
	}
	return Record{}, io.EOF
}

func (mt *multiTail) Close() error {
	mt.once.Do(func() {
		mt.cancel()
		mt.wg.Wait()
	})
	return nil
}
