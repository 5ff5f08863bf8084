package enginesim

import (
	"context"
	"slices"
	"sync"
	"time"
)

// EventKind is the type of a KV event.
type EventKind uint8

// vLLM's three event kinds, then Meridian's lifecycle events.
const (
	BlockStored EventKind = iota + 1
	BlockRemoved
	AllBlocksCleared
	PodUp
	PodDown
)

func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	case PodUp:
		return "PodUp"
	case PodDown:
		return "PodDown"
	}
	return "unknown"
}

// MediumGPU is the medium of every block the simulator caches.
const MediumGPU = "GPU"

// Event is one KV event as the engine emits it. Fields not used by a kind
// are zero.
type Event struct {
	Kind EventKind
	// BlockHashes: engine hashes of the stored or removed blocks.
	BlockHashes []uint64
	// ParentHash is the engine hash of the block before the first stored one;
	// valid when HasParent (absent for the first block of a sequence).
	ParentHash uint64
	HasParent  bool
	// TokenIDs are the stored blocks' tokens, concatenated.
	TokenIDs  []uint32
	BlockSize int
	// LoRAName is the adapter of the stored blocks; "" for the base model.
	LoRAName string
	// CacheSalt is the cache_salt of the request whose chain the blocks
	// belong to ("" if none): vLLM writes it in the extra keys of a chain's
	// first block, SGLang on every event of a salted chain, TensorRT-LLM
	// nowhere.
	CacheSalt string
	// Medium is "GPU" for stored and removed blocks.
	Medium string
	// Pod describes the pod in PodUp and PodDown.
	Pod PodInfo
}

// PodInfo is what lifecycle events say about the pod.
type PodInfo struct {
	Name     string
	Endpoint string
	Model    string
	Hardware string
	Region   string
	Epoch    uint64
	Reason   string        // PodDown only, e.g. "shutdown"
	Engine   string        // PodUp only: the engine kind
	KVBlocks uint64        // PodUp only: the KV-cache capacity in blocks
	TTL      time.Duration // PodUp only: how long it holds (0: until PodDown)
}

// Batch is one vLLM KVEventBatch plus what Meridian's transport adds: the
// pod it comes from, its sequence number (from 0 per process start, +1 per
// batch, skipping one when events were dropped) and the process epoch.
type Batch struct {
	Pod    string
	Engine string // the engine kind whose wire form KVBatch writes
	Seq    uint64
	Epoch  uint64
	TS     time.Time
	DPRank int
	Events []Event
}

// Publisher carries event batches off the engine (to Kafka, ZMQ, or memory).
// Publish is called from one goroutine at a time, in sequence order; an
// error makes the engine retry the same batch later.
type Publisher interface {
	Publish(ctx context.Context, b Batch) error
}

// MemoryPublisher keeps every batch in memory, for tests and in-process
// setups. Safe for concurrent use.
type MemoryPublisher struct {
	mu      sync.Mutex
	batches []Batch
	changed chan struct{}
}

// NewMemoryPublisher returns an empty MemoryPublisher.
func NewMemoryPublisher() *MemoryPublisher {
	return &MemoryPublisher{changed: make(chan struct{})}
}

// Publish implements Publisher.
func (m *MemoryPublisher) Publish(_ context.Context, b Batch) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	b.Events = slices.Clone(b.Events)
	m.batches = append(m.batches, b)
	close(m.changed)
	m.changed = make(chan struct{})
	return nil
}

// Batches returns a copy of the batches published so far.
func (m *MemoryPublisher) Batches() []Batch {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.batches)
}

// Events returns every published event in order.
func (m *MemoryPublisher) Events() []Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Event
	for _, b := range m.batches {
		out = append(out, b.Events...)
	}
	return out
}

// Changed returns a channel closed at the next Publish.
func (m *MemoryPublisher) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

// WaitFor blocks until cond holds for the published events or ctx ends.
func (m *MemoryPublisher) WaitFor(ctx context.Context, cond func(events []Event) bool) error {
	for {
		ch := m.Changed()
		if cond(m.Events()) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
