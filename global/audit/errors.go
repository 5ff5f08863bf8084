package audit

import (
	"errors"
	"fmt"
)

// ErrClosed is the cause of an *AppendError after Close.
var ErrClosed = errors.New("audit log closed")

// AppendError reports that a record was not durably written. The caller must
// not route across regions on the decision it describes (fail closed). When
// Op is "wait" the context ended while the batch was in flight: the record
// may still reach the disk, but nothing confirmed it.
type AppendError struct {
	Op   string // "append", "wait", "rotate", "write", "sync"
	Path string // segment file, when one is involved
	Err  error
}

func (e *AppendError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("audit append: %s: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("audit append: %s %s: %v", e.Op, e.Path, e.Err)
}

func (e *AppendError) Unwrap() error { return e.Err }

// CorruptError is returned by Open when the segment it must continue from
// does not hold a valid chain; run Verify (meridian audit verify) on the
// directory. Open never rewrites such a segment.
type CorruptError struct {
	Segment string // path of the segment
	Line    int    // 1-based line number
	Reason  string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("audit log corrupt: %s line %d: %s", e.Segment, e.Line, e.Reason)
}
