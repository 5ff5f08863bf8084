package sim

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// TraceBlockSize is the number of tokens per hash id in Mooncake's traces
// (other traces in the format use other sizes, e.g. 256).
const TraceBlockSize = 512

// TraceRecord is one request of a Mooncake-format trace (FAST '25 artifact,
// appendix A): one JSON object per line.
type TraceRecord struct {
	// Timestamp is the arrival time in milliseconds from the trace's start.
	Timestamp int64 `json:"timestamp"`
	// InputLength and OutputLength are token counts.
	InputLength  int `json:"input_length"`
	OutputLength int `json:"output_length"`
	// HashIDs are prefix-chained block ids: one per 512-token block (the last
	// one possibly partial), each covering its block and every block before.
	HashIDs []uint64 `json:"hash_ids"`
}

// ErrBadTrace is wrapped by every error about a trace's content.
var ErrBadTrace = errors.New("bad trace")

// TraceError names the line of a trace that could not be used.
type TraceError struct {
	Line   int    // 1-based
	Reason string // what is wrong, with the offending value
}

func (e *TraceError) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Reason) }
func (e *TraceError) Unwrap() error { return ErrBadTrace }

// maxTraceLine bounds one line of a trace (a 1M-token prompt is ~2,000 ids).
const maxTraceLine = 16 << 20

// LoadTraceFile reads a Mooncake-format trace file (see ReadTrace).
func LoadTraceFile(path string, blockSize int) ([]TraceRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load trace: %w", err)
	}
	defer f.Close()
	recs, err := ReadTrace(f, blockSize)
	if err != nil {
		return nil, fmt.Errorf("load trace %s: %w", path, err)
	}
	return recs, nil
}

// ReadTrace reads a Mooncake-format trace: one JSON object per line with
// timestamp (ms, >= 0), input_length (> 0), output_length (>= 0) and
// hash_ids (1 to 1<<16 ids: one per blockSize-token block of the input, the
// last one possibly partial; one more or one less is tolerated). Unknown fields are ignored, blank lines skipped. The
// records are returned sorted by timestamp (stable: equal timestamps keep
// file order). The first bad line stops the read with a *TraceError; an
// empty trace is an error too.
func ReadTrace(r io.Reader, blockSize int) ([]TraceRecord, error) {
	if blockSize < 1 {
		return nil, fmt.Errorf("read trace: block size = %d, want >= 1", blockSize)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxTraceLine)
	var out []TraceRecord
	line := 0
	sorted := true
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var rec struct {
			Timestamp    *float64  `json:"timestamp"`
			InputLength  *int      `json:"input_length"`
			OutputLength *int      `json:"output_length"`
			HashIDs      *[]uint64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, &TraceError{Line: line, Reason: fmt.Sprintf("not a trace record: %v", err)}
		}
		switch {
		case rec.Timestamp == nil:
			return nil, &TraceError{Line: line, Reason: "missing timestamp"}
		case rec.InputLength == nil:
			return nil, &TraceError{Line: line, Reason: "missing input_length"}
		case rec.OutputLength == nil:
			return nil, &TraceError{Line: line, Reason: "missing output_length"}
		case rec.HashIDs == nil:
			return nil, &TraceError{Line: line, Reason: "missing hash_ids"}
		}
		ts, in, outLen, ids := *rec.Timestamp, *rec.InputLength, *rec.OutputLength, *rec.HashIDs
		blocks := (in + blockSize - 1) / blockSize
		switch {
		case !(ts >= 0) || ts > 1e15:
			return nil, &TraceError{Line: line, Reason: fmt.Sprintf("timestamp = %v, want 0..1e15 ms", ts)}
		case in <= 0 || in > 1<<24:
			return nil, &TraceError{Line: line, Reason: fmt.Sprintf("input_length = %d, want 1..%d", in, 1<<24)}
		case outLen < 0 || outLen > 1<<24:
			return nil, &TraceError{Line: line, Reason: fmt.Sprintf("output_length = %d, want 0..%d", outLen, 1<<24)}
		case len(ids) == 0 || len(ids) > 1<<16:
			return nil, &TraceError{Line: line, Reason: fmt.Sprintf("hash_ids has %d ids, want 1..%d", len(ids), 1<<16)}
		case len(ids) > blocks+1 || len(ids) < blocks-1:
			return nil, &TraceError{Line: line, Reason: fmt.Sprintf("hash_ids has %d ids for input_length %d, want %d (one per %d-token block)", len(ids), in, blocks, blockSize)}
		}
		t := int64(ts)
		if n := len(out); n > 0 && t < out[n-1].Timestamp {
			sorted = false
		}
		out = append(out, TraceRecord{Timestamp: t, InputLength: in, OutputLength: outLen, HashIDs: ids})
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &TraceError{Line: line + 1, Reason: fmt.Sprintf("line longer than %d bytes", maxTraceLine)}
		}
		return nil, fmt.Errorf("read trace: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no records", ErrBadTrace)
	}
	if !sorted {
		slices.SortStableFunc(out, func(a, b TraceRecord) int { return cmp.Compare(a.Timestamp, b.Timestamp) })
	}
	return out, nil
}
