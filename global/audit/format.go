package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// AppendText appends a one-line human rendering of r (no newline).
func (r *Record) AppendText(b []byte) []byte {
	b = r.Time.UTC().AppendFormat(b, "2006-01-02T15:04:05.000Z")
	b = fmt.Appendf(b, " %s#%d %s %s", r.Controller, r.Seq, r.Kind, r.Origin)
	if r.Region != "" {
		b = fmt.Appendf(b, " -> %s", r.Region)
		if r.Pod != "" {
			b = fmt.Appendf(b, "/%s", r.Pod)
		}
	}
	if d, ok := r.Admin(); ok {
		b = appendAdminText(b, d)
		for _, kv := range [][2]string{{"policy", r.PolicyVersion}, {"decision", r.DecisionID}, {"request", r.RequestID}} {
			if kv[1] != "" {
				b = fmt.Appendf(b, " %s=%s", kv[0], quoteIfNeeded(kv[1]))
			}
		}
		return b
	}
	for _, kv := range [][2]string{
		{"class", r.DataClass}, {"rule", r.Rule}, {"policy", r.PolicyVersion},
		{"decision", r.DecisionID}, {"request", r.RequestID}, {"tenant", short(r.TenantHMAC)}, {"session", short(r.SessionHMAC)},
	} {
		if kv[1] != "" {
			b = fmt.Appendf(b, " %s=%s", kv[0], quoteIfNeeded(kv[1]))
		}
	}
	if c := string(r.Cost); c != "" && c != "{}" {
		b = append(b, " cost="...)
		b = append(b, c...)
	}
	return b
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12] + "…"
	}
	return h
}

func quoteIfNeeded(s string) string {
	if strings.ContainsAny(s, " \t\n\"=") {
		return fmt.Sprintf("%q", s)
	}
	return s
}

// writeRecord writes r as a canonical JSON line or as a human line.
func writeRecord(w io.Writer, r *Record, asJSON bool, buf []byte) ([]byte, error) {
	var err error
	if asJSON {
		if buf, err = r.AppendCanonical(buf[:0]); err != nil {
			return buf, err
		}
	} else {
		buf = r.AppendText(buf[:0])
	}
	buf = append(buf, '\n')
	_, err = w.Write(buf)
	return buf, err
}

// WriteQuery runs q on src and writes the records to w, as canonical JSON
// lines or one human line each. It returns how many it wrote.
func WriteQuery(ctx context.Context, src Source, q Query, w io.Writer, asJSON bool) (int, error) {
	cur, err := src.Query(ctx, q)
	if err != nil {
		return 0, err
	}
	defer cur.Close()
	n := 0
	var buf []byte
	for {
		r, err := cur.Next()
		if err == io.EOF {
			return n, cur.Close()
		}
		if err != nil {
			return n, err
		}
		if buf, err = writeRecord(w, &r, asJSON, buf); err != nil {
			return n, err
		}
		n++
	}
}

// WriteTail follows src and writes each new matching record to w until ctx
// ends (then it returns nil) or the source ends.
func WriteTail(ctx context.Context, src Source, q Query, w io.Writer, asJSON bool) error {
	cur, err := src.Tail(ctx, q)
	if err != nil {
		return err
	}
	defer cur.Close()
	var buf []byte
	for {
		r, err := cur.Next()
		if err == io.EOF || (err != nil && ctx.Err() != nil) {
			return nil
		}
		if err != nil {
			return err
		}
		if buf, err = writeRecord(w, &r, asJSON, buf); err != nil {
			return err
		}
		if f, ok := w.(interface{ Flush() error }); ok {
			if err := f.Flush(); err != nil {
				return err
			}
		}
	}
}

// WriteJSON writes the report as one JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	out := struct {
		OK bool `json:"ok"`
		*Report
	}{r.OK(), r}
	if out.Problems == nil {
		out.Problems = []Problem{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// ParseTimeFlag reads a time given on the command line: RFC 3339, a date
// (2006-01-02, UTC midnight), or a duration meaning that long before now
// ("90m" is 90 minutes ago).
func ParseTimeFlag(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse("2006-01-02", s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is not an RFC 3339 time, a date (YYYY-MM-DD) or a duration ago (e.g. 90m)", s)
}
