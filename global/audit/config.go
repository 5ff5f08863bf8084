package audit

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Log. Zero fields are not defaulted: start from
// DefaultConfig and set Dir, ControllerID and HMACKey.
type Config struct {
	// Dir is the audit root; the log writes Dir/<ControllerID>/. Required.
	Dir string
	// ControllerID names the writing controller; it is a directory name and
	// is stored in every record. Required; [A-Za-z0-9._-], 1..128 bytes.
	ControllerID string
	// HMACKey keys the HMAC of tenant and session ids. Required, at least
	// MinKeyBytes bytes. Changing it makes old tenant HMACs unsearchable with
	// the new key (records carry the key id, kid).
	HMACKey []byte `json:"-"`
	// MaxSegmentBytes rotates the segment once it holds this many bytes; a
	// segment may exceed it by up to one batch. Default 64 MiB; minimum 4 KiB.
	MaxSegmentBytes int64
	// MaxSegmentAge rotates a segment this long after it was created, at the
	// next append. Default 1h; minimum 1s.
	MaxSegmentAge time.Duration
	// IndexEvery puts a sparse index entry (time, seq, byte offset) at every
	// IndexEvery-th record of a segment. Default 128; 1..1<<20.
	IndexEvery int
	// MaxBatch is the most records written by one fsync (group commit).
	// Default 4096; 1..1<<20.
	MaxBatch int
	// QueueLen is the number of appends that may wait for the writer before
	// Append blocks. Default 8192; >= 1.
	QueueLen int
	// CheckpointInterval is how often the chain head is handed to the
	// CheckpointSink when it has moved. Default 30s; 10s..60s.
	CheckpointInterval time.Duration
	// CheckpointTimeout bounds one CheckpointSink call. Default 5s; > 0.
	CheckpointTimeout time.Duration
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		MaxSegmentBytes:    64 << 20,
		MaxSegmentAge:      time.Hour,
		IndexEvery:         128,
		MaxBatch:           4096,
		QueueLen:           8192,
		CheckpointInterval: 30 * time.Second,
		CheckpointTimeout:  5 * time.Second,
	}
}

// Validate returns an error naming the first invalid field and its value.
func (c Config) Validate() error {
	switch {
	case c.Dir == "":
		return errors.New("audit config: Dir is empty")
	case !validControllerID(c.ControllerID):
		//lint:ignore ST1005 the message ends with the literal name "..", which is not punctuation
		return fmt.Errorf("audit config: ControllerID %q must be 1..128 bytes of [A-Za-z0-9._-] and not . or ..", c.ControllerID)
	case len(c.HMACKey) < MinKeyBytes:
		return fmt.Errorf("audit config: HMACKey has %d bytes, need at least %d", len(c.HMACKey), MinKeyBytes)
	case c.MaxSegmentBytes < 4096:
		return fmt.Errorf("audit config: MaxSegmentBytes %d is below 4096", c.MaxSegmentBytes)
	case c.MaxSegmentAge < time.Second:
		return fmt.Errorf("audit config: MaxSegmentAge %s is below 1s", c.MaxSegmentAge)
	case c.IndexEvery < 1 || c.IndexEvery > 1<<20:
		return fmt.Errorf("audit config: IndexEvery %d is outside 1..%d", c.IndexEvery, 1<<20)
	case c.MaxBatch < 1 || c.MaxBatch > 1<<20:
		return fmt.Errorf("audit config: MaxBatch %d is outside 1..%d", c.MaxBatch, 1<<20)
	case c.QueueLen < 1:
		return fmt.Errorf("audit config: QueueLen %d is below 1", c.QueueLen)
	case c.CheckpointInterval < 10*time.Second || c.CheckpointInterval > 60*time.Second:
		return fmt.Errorf("audit config: CheckpointInterval %s is outside 10s..60s", c.CheckpointInterval)
	case c.CheckpointTimeout <= 0:
		return fmt.Errorf("audit config: CheckpointTimeout %s must be positive", c.CheckpointTimeout)
	}
	return nil
}

func validControllerID(id string) bool {
	if id == "" || len(id) > 128 || id == "." || id == ".." {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

// Deps are the collaborators of a Log; every field may be nil.
type Deps struct {
	Sink       CheckpointSink        // nil: checkpoints are only available from Log.Checkpoint
	Clock      Clock                 // nil: the system clock
	FS         FS                    // nil: the operating system's file system
	Registerer prometheus.Registerer // nil: metrics are kept but not registered
	Logger     *slog.Logger          // nil: discard
}

// Clock is the time source of a Log: record times, segment age and the
// checkpoint interval. audittest.Clock is a manual implementation for tests.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// FS is the file system a Log writes through; tests inject faults with it.
// Reads (recovery, queries, Verify) use the operating system directly.
type FS interface {
	MkdirAll(path string, perm fs.FileMode) error
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	Rename(oldpath, newpath string) error
	Remove(name string) error
}

// File is an open file of an FS.
type File interface {
	io.Writer
	Sync() error
	Truncate(size int64) error
	Close() error
}

// OSFS is the operating system's file system.
type OSFS struct{}

func (OSFS) MkdirAll(path string, perm fs.FileMode) error { return os.MkdirAll(path, perm) }
func (OSFS) Rename(oldpath, newpath string) error         { return os.Rename(oldpath, newpath) }
func (OSFS) Remove(name string) error                     { return os.Remove(name) }
func (OSFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return f, nil
}
