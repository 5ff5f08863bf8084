package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Checkpoint anchors a controller's chain: the record with seq LastSeq, the
// last of Count records in Segment so far, has hash Head. Because each record
// holds the hash of the one before, a checkpoint commits to the whole chain
// up to LastSeq. Checkpoints are replicated by Raft (through a
// CheckpointSink), so editing or cutting a region's files no longer matches
// what the other regions hold.
type Checkpoint struct {
	Controller string    `json:"controller"`
	Segment    string    `json:"segment"`  // file name, e.g. 00000000000000000001.jsonl
	LastSeq    uint64    `json:"last_seq"` // seq of the chain head
	Head       string    `json:"head"`     // hash of record LastSeq (hex)
	Count      uint64    `json:"count"`    // records in Segment up to and including LastSeq
	Time       time.Time `json:"time"`     // when the checkpoint was taken
}

// CheckpointSink receives checkpoints (implemented by the Raft FSM's
// client). Publish must be idempotent: the same checkpoint may be offered
// again after an error. A failing sink never blocks appends.
type CheckpointSink interface {
	PublishCheckpoint(ctx context.Context, cp Checkpoint) error
}

// ReadCheckpoints reads checkpoints as JSON lines (blank lines skipped), the
// format WriteCheckpoint and FileSink write. Errors name the line.
func ReadCheckpoints(r io.Reader) ([]Checkpoint, error) {
	var out []Checkpoint
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var cp Checkpoint
		if err := json.Unmarshal(line, &cp); err != nil {
			return nil, fmt.Errorf("read checkpoints: line %d: %w", n, err)
		}
		if cp.Controller == "" || cp.Segment == "" || cp.LastSeq == 0 || len(cp.Head) != 64 {
			return nil, fmt.Errorf("read checkpoints: line %d: needs controller, segment, last_seq > 0 and a 64-hex head", n)
		}
		out = append(out, cp)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read checkpoints: %w", err)
	}
	return out, nil
}

// ReadCheckpointsFile is ReadCheckpoints on a file.
func ReadCheckpointsFile(path string) ([]Checkpoint, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read checkpoints: %w", err)
	}
	defer f.Close()
	cps, err := ReadCheckpoints(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cps, nil
}

// WriteCheckpoint writes cp as one JSON line.
func WriteCheckpoint(w io.Writer, cp Checkpoint) error {
	b, err := json.Marshal(cp)
	if err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// FileSink appends checkpoints to a JSON Lines file and fsyncs it. It is for
// single-process setups (the demo, tests); a file beside the log is not
// tamper-evident the way Raft replication to other regions is.
type FileSink struct {
	Path string
	mu   sync.Mutex
}

// PublishCheckpoint appends cp to the file.
func (s *FileSink) PublishCheckpoint(_ context.Context, cp Checkpoint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := os.OpenFile(s.Path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("publish checkpoint: %w", err)
	}
	if err := WriteCheckpoint(f, cp); err != nil {
		f.Close()
		return fmt.Errorf("publish checkpoint: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("publish checkpoint: %w", err)
	}
	return f.Close()
}
