package regional

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/segmentio/kafka-go"
)

// A broker that lost its data starts its partitions at offset 0 again. The
// ingester notices while a partition is still shorter than what it applied
// (a message at an applied offset whose partition ends below it, or a probe
// finding the end at or below it). But the engines keep publishing: once a
// partition has grown past the offset applied before, nothing in the
// offsets tells, and the consumer, which asks for the next offset and
// waits while it lies beyond the end, resumes there, having skipped every
// message before it for good (a TTL's worth of PodUps, the BlockStored
// events of the caches warmed meanwhile).
//
// So every probe also checks that the partition still holds, at the offset
// of a message applied before, that same message: the first message
// applied of a partition is its anchor (its offset and a hash of its key,
// value and timestamp), and each probe fetches the message at the anchor's
// offset and compares, then takes the last message applied since as the
// next anchor. Another message there means the partition
// was rewritten, and the consumer may already have applied some of its
// new messages while it skipped the ones before them, of older batch
// sequence numbers (which it would then refuse as duplicates) and older
// events (which applied late could resurrect blocks removed since). So the
// pods of that partition are cleared (meridian_ingest_pod_clears_total
// {cause="rewritten"}) and forget their sequence numbers, and the partition
// is reset (meridian_ingest_resets_total{cause="rewritten"}) and re-read
// from its new start, in order: the pods' blocks are then exactly what the
// partition says, as a naive scan of it would have them. What the engines
// cached before the broker's loss, and no longer on any log, is not
// predicted until they store it again: a miss predicted where there is a
// hit costs a routing choice, never a wrong answer. A partition whose log
// no longer reaches back to the anchor (retention) gives no verdict, nor
// does a failed fetch (that anchor is asked again).

// logMark identifies one message of a partition.
type logMark struct {
	offset int64
	sum    uint64 // of key, value and timestamp
}

// markSrc is the last message applied of a partition: its mark, or (lazy)
// what to compute the mark from. markOf hashes the whole message, as long
// as the pass that decodes it; the consumer applies thousands of messages
// between two probes, and a probe needs the mark of the last one only.
type markSrc struct {
	mark  logMark // the offset only, while lazy
	key   []byte
	value []byte
	at    time.Time
	lazy  bool
}

// get returns the mark, computing it (once) if it is lazy.
func (m *markSrc) get() logMark {
	if m.lazy {
		m.mark = markOf(m.mark.offset, m.key, m.value, m.at)
		m.key, m.value, m.lazy = nil, nil, false
	}
	return m.mark
}

func markOf(offset int64, key, value []byte, at time.Time) logMark {
	d := xxhash.New()
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(key)))
	_, _ = d.Write(n[:])
	_, _ = d.Write(key)
	_, _ = d.Write(value)
	binary.LittleEndian.PutUint64(n[:], uint64(at.UnixMilli()))
	_, _ = d.Write(n[:])
	return logMark{offset: offset, sum: d.Sum64()}
}

// checkAnchors verifies the anchors of the partitions that reach past them
// (ends: their end offsets now) and resets those rewritten. A verified
// anchor, or one the log no longer holds (retention), moves on to the
// last message applied since; one that could not be read (a failed fetch)
// stays, to be verified by the next probe: moving it on could take a
// message of the rewritten partition as the next anchor.
func (g *Ingester) checkAnchors(ctx context.Context, c *kafka.Client, ends map[int]int64) {
	g.mu.Lock()
	anchors := make(map[int]logMark, len(g.anchors))
	for p, a := range g.anchors {
		anchors[p] = a
	}
	g.mu.Unlock()
	keep := map[int]bool{}
	for p, a := range anchors {
		if end, ok := ends[p]; !ok || end <= a.offset {
			keep[p] = true // a shorter partition is checkEnds's; nothing to compare yet
			continue
		}
		m, v := g.markAt(ctx, c, p, a.offset)
		switch {
		case v == verdictUnknown:
			keep[p] = true
		case v == verdictRead && m != a:
			g.mu.Lock()
			if cur, still := g.anchors[p]; still && cur == a {
				g.rewrittenLocked(p, ends)
			}
			g.mu.Unlock()
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.advanceAnchorsLocked(keep)
}

// advanceAnchorsLocked takes the last message applied of each partition
// as its next anchor, but for the partitions to keep (their anchor not
// verified yet) that have one.
func (g *Ingester) advanceAnchorsLocked(keep map[int]bool) {
	for p, m := range g.marks {
		if _, ok := g.anchors[p]; !ok || !keep[p] {
			g.anchors[p] = m.get()
			g.marks[p] = m
		}
	}
}

// rewrittenLocked clears the pods of partition p, which was rewritten, and
// has it re-read from its start.
func (g *Ingester) rewrittenLocked(p int, ends map[int]int64) {
	for _, name := range slices.Sorted(maps.Keys(g.pods)) {
		if ps := g.pods[name]; ps.partition == p {
			g.clearPod(name, ps, "rewritten")
			clear(ps.seqs)
		}
	}
	g.resetLocked([]int{p}, ends, "rewritten")
}

// What reading the message at an anchor's offset came to.
type verdict uint8

const (
	verdictUnknown verdict = iota // the fetch failed: ask again
	verdictRead                   // the message is there (compare it)
	verdictGone                   // the log no longer holds the offset
)

// markAt reads the message at offset of partition p.
func (g *Ingester) markAt(ctx context.Context, c *kafka.Client, p int, offset int64) (logMark, verdict) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := c.Fetch(ctx, &kafka.FetchRequest{Topic: g.cfg.Topic, Partition: p, Offset: offset,
		// The batch holding the offset comes back whatever MaxBytes (KIP-74):
		// ask for no more than that.
		MinBytes: 1, MaxBytes: 1, MaxWait: 100 * time.Millisecond})
	switch {
	case err != nil:
		return logMark{}, verdictUnknown
	case errors.Is(res.Error, kafka.OffsetOutOfRange):
		return logMark{}, verdictGone // retention (a partition ending before it is checkEnds's)
	case res.Error != nil || res.Records == nil:
		return logMark{}, verdictUnknown
	}
	for {
		r, err := res.Records.ReadRecord()
		if err != nil {
			return logMark{}, verdictUnknown // not in what came back
		}
		if r.Offset < offset {
			continue // a batch may start before the offset asked for
		}
		if r.Offset > offset {
			return logMark{}, verdictGone // compacted away
		}
		key, kerr := readBytes(r.Key)
		value, verr := readBytes(r.Value)
		if errors.Join(kerr, verr) != nil {
			return logMark{}, verdictUnknown
		}
		return markOf(r.Offset, key, value, r.Time), verdictRead
	}
}

func readBytes(b kafka.Bytes) ([]byte, error) {
	if b == nil {
		return nil, nil
	}
	defer b.Close()
	return io.ReadAll(b)
}
