package summary

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/meridian-llm/meridian/index"
)

// Scheme names the block hashing a summary's keys come from. Both sides must
// hash chains the same way for a query to match.
type Scheme uint8

// SchemeChainV1 is index.ChainHashes: xxhash64 chained over token-id blocks,
// seeded by the namespace ("meridian/chain/v1").
const SchemeChainV1 Scheme = 1

// Limits on what a summary may carry (checked by Build and Decode).
const (
	MaxRegionLen   = 64
	MaxModels      = 64
	MaxModelLen    = 256
	MaxProfiles    = 32
	MaxProfileLen  = 64
	MaxBlockSize   = 1 << 20
	DefaultMaxSize = 64 << 10 // bytes of an encoded summary
	minMaxSize     = 1 << 10
)

// ProfileLoad is the load and free capacity of a region's pods of one
// hardware profile (gorgo.Profile names), as the region's own in-flight
// accounting saw it when the summary was built.
type ProfileLoad struct {
	Profile              string `json:"profile"`
	Pods                 int    `json:"pods"`                   // live pods
	PendingPrefillTokens int64  `json:"pending_prefill_tokens"` // prefill work queued or running, summed over pods
	Running              int    `json:"running"`                // requests in flight, summed over pods
	Slots                int    `json:"slots"`                  // requests the pods can run at once, summed
	FreeKVBlocks         int64  `json:"free_kv_blocks"`         // free KV-cache blocks, summed over pods
}

// Summary is a region's compact, approximate description of what its pods
// cache, with its load. It is immutable once built or decoded: share it, do
// not modify its fields.
type Summary struct {
	Region     string
	Generation uint64    // increases with every summary a region publishes (NextGeneration)
	BuiltAt    time.Time // on the building controller's clock
	BlockSize  int       // tokens per block of the chains the keys come from
	Scheme     Scheme
	SampleRate uint32 // S: about one block hash in S is kept (Sampler)
	Blocks     uint64 // distinct blocks held by live pods when built
	Sampled    uint32 // block hashes in the filter
	Models     []string
	Load       []ProfileLoad // sorted by profile name

	sampler Sampler
	filter  fuse8
}

// Sampler is the hash-based sampling rule shared by builder and reader:
// a block hash h is kept iff h*sampleMul <= MaxUint64/S (mod 2^64). The
// multiplication is a bijection of uint64, so for uniformly distributed
// hashes exactly the fraction 1/S passes, and both sides agree on which
// positions of any chain are sampled without knowing their depths.
type Sampler struct {
	rate  uint32
	limit uint64
}

const sampleMul = 0xd6e8feb86659fd93 // odd; unrelated to the index's shard multiplier

// NewSampler returns the sampler keeping about one hash in rate (rate >= 1).
func NewSampler(rate uint32) Sampler {
	rate = max(rate, 1)
	return Sampler{rate: rate, limit: math.MaxUint64 / uint64(rate)}
}

// Keep reports whether h is sampled.
func (s Sampler) Keep(h uint64) bool { return h*sampleMul <= s.limit }

// Rate returns S.
func (s Sampler) Rate() uint32 { return s.rate }

// NextGeneration returns a generation above prev that also survives a
// restart: the wall clock in milliseconds when it is ahead of prev+1.
func NextGeneration(prev uint64, now time.Time) uint64 {
	return max(prev+1, uint64(max(now.UnixMilli(), 0)))
}

// Input is what a summary says besides its block hashes.
type Input struct {
	Region     string
	Generation uint64
	BuiltAt    time.Time
	BlockSize  int
	Models     []string      // models the region serves (sorted and deduplicated by Build)
	Load       []ProfileLoad // one entry per hardware profile
}

// BuildConfig bounds a summary.
type BuildConfig struct {
	// MaxBytes bounds the encoded summary. Default DefaultMaxSize (64 KiB).
	MaxBytes int
	// SampleRate fixes S. 0 (the default) picks the smallest S whose summary
	// fits MaxBytes.
	SampleRate uint32
}

// DefaultBuildConfig returns a 64 KiB budget with the sampling rate chosen
// to fit it.
func DefaultBuildConfig() BuildConfig { return BuildConfig{MaxBytes: DefaultMaxSize} }

// Validate names the first bad field.
func (c BuildConfig) Validate() error {
	if c.MaxBytes < minMaxSize {
		return fmt.Errorf("%w: BuildConfig.MaxBytes = %d, want >= %d", ErrInvalidInput, c.MaxBytes, minMaxSize)
	}
	return nil
}

// ErrInvalidInput is wrapped by Build's errors about its input or config.
var ErrInvalidInput = errors.New("invalid summary input")

// ErrTooLarge is returned when a summary cannot fit MaxBytes at the fixed
// SampleRate (or its header alone does not fit).
var ErrTooLarge = errors.New("summary exceeds its size budget")

func (in *Input) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidInput, fmt.Sprintf(format, args...))
	}
	if err := checkName("Region", in.Region, MaxRegionLen); err != nil {
		return bad("%v", err)
	}
	if y := in.BuiltAt.Year(); in.BuiltAt.IsZero() || y < 1970 || y > 2261 {
		return bad("BuiltAt = %v, want a time between 1970 and 2261", in.BuiltAt)
	}
	if in.BlockSize < 1 || in.BlockSize > MaxBlockSize {
		return bad("BlockSize = %d, want 1..%d", in.BlockSize, MaxBlockSize)
	}
	if len(in.Models) > MaxModels {
		return bad("Models: %d entries, want <= %d", len(in.Models), MaxModels)
	}
	for i, m := range in.Models {
		if err := checkName(fmt.Sprintf("Models[%d]", i), m, MaxModelLen); err != nil {
			return bad("%v", err)
		}
	}
	if len(in.Load) > MaxProfiles {
		return bad("Load: %d profiles, want <= %d", len(in.Load), MaxProfiles)
	}
	seen := map[string]bool{}
	for i, p := range in.Load {
		if err := checkName(fmt.Sprintf("Load[%d].Profile", i), p.Profile, MaxProfileLen); err != nil {
			return bad("%v", err)
		}
		if seen[p.Profile] {
			return bad("Load[%d].Profile %q appears twice", i, p.Profile)
		}
		seen[p.Profile] = true
		if err := p.check(); err != nil {
			return bad("Load[%d]: %v", i, err)
		}
	}
	return nil
}

func (p ProfileLoad) check() error {
	switch {
	case p.Pods < 0 || p.Pods > math.MaxUint32:
		//lint:ignore ST1005 it starts with the field's Go name; validate prefixes it with Load[i]
		return fmt.Errorf("Pods = %d, want 0..%d", p.Pods, uint32(math.MaxUint32))
	case p.PendingPrefillTokens < 0:
		return fmt.Errorf("PendingPrefillTokens = %d, want >= 0", p.PendingPrefillTokens)
	case p.Running < 0 || p.Running > math.MaxUint32:
		//lint:ignore ST1005 it starts with the field's Go name; validate prefixes it with Load[i]
		return fmt.Errorf("Running = %d, want 0..%d", p.Running, uint32(math.MaxUint32))
	case p.Slots < 0 || p.Slots > math.MaxUint32:
		//lint:ignore ST1005 it starts with the field's Go name; validate prefixes it with Load[i]
		return fmt.Errorf("Slots = %d, want 0..%d", p.Slots, uint32(math.MaxUint32))
	case p.FreeKVBlocks < 0:
		return fmt.Errorf("FreeKVBlocks = %d, want >= 0", p.FreeKVBlocks)
	}
	return nil
}

// checkName accepts 1..maxLen bytes of printable UTF-8.
func checkName(field, s string, maxLen int) error {
	if s == "" || len(s) > maxLen {
		return fmt.Errorf("%s %q: want 1..%d bytes", field, s, maxLen)
	}
	if !utf8.ValidString(s) || strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0 {
		return fmt.Errorf("%s %q: want printable UTF-8", field, s)
	}
	return nil
}

// Build makes the summary of a region holding the given block hashes (every
// distinct block held by a live pod; order does not matter, duplicates are
// ignored). hashes is not modified.
func Build(in Input, hashes []uint64, cfg BuildConfig) (*Summary, error) {
	return build(in, hashes, uint64(len(hashes)), 1, cfg)
}

// FromIndex builds the summary of the blocks held by x's live pods. It reads
// only the sampled hashes out of the index (AppendHashes with the sampler),
// so it allocates for about MaxBytes entries, not for every block.
func FromIndex(x *index.Index, in Input, cfg BuildConfig) (*Summary, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := in.validate(); err != nil {
		return nil, err
	}
	blocks := uint64(x.Stats().Blocks) // includes blocks of dead pods not yet swept: an upper bound
	rate := cfg.SampleRate
	if rate == 0 {
		rate = chooseRate(blocks, cfg.MaxBytes-headerSize(&in))
	}
	keys := x.AppendHashes(nil, NewSampler(rate).Keep)
	return build(in, keys, blocks, rate, cfg)
}

// build samples hashes at the chosen rate (they may already be sampled at
// minRate <= that rate) and builds the filter, raising the rate until the
// encoding fits.
func build(in Input, hashes []uint64, blocks uint64, minRate uint32, cfg BuildConfig) (*Summary, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := in.validate(); err != nil {
		return nil, err
	}
	in.Models = slices.Compact(slices.Sorted(slices.Values(in.Models)))
	in.Load = slices.Clone(in.Load)
	slices.SortFunc(in.Load, func(a, b ProfileLoad) int { return strings.Compare(a.Profile, b.Profile) })
	room := cfg.MaxBytes - headerSize(&in)
	if room < 0 {
		return nil, fmt.Errorf("build summary: %w: header alone is %d bytes, MaxBytes %d", ErrTooLarge, headerSize(&in), cfg.MaxBytes)
	}
	rate := cfg.SampleRate
	if rate == 0 {
		rate = max(chooseRate(blocks, room), minRate)
	}
	s := NewSampler(rate)
	keys := make([]uint64, 0, min(uint64(len(hashes)), blocks/uint64(rate)+blocks/uint64(rate)/8+16))
	for _, h := range hashes {
		if s.Keep(h) {
			keys = append(keys, h)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	if blocks < uint64(len(hashes)) {
		blocks = uint64(len(hashes))
	}
	for fuseBytes(len(keys)) > room {
		if cfg.SampleRate != 0 {
			return nil, fmt.Errorf("build summary: %w: %d sampled blocks at rate %d need %d bytes, %d left after the header",
				ErrTooLarge, len(keys), rate, fuseBytes(len(keys)), room)
		}
		// An unlucky sample: raise the rate and thin the sample (a hash kept
		// at a higher rate is kept at every lower one).
		rate = rate + rate/32 + 1
		s = NewSampler(rate)
		keys = slices.DeleteFunc(keys, func(h uint64) bool { return !s.Keep(h) })
	}
	f, err := buildFuse8(keys, in.Generation)
	if err != nil {
		return nil, fmt.Errorf("build summary: %w", err)
	}
	return &Summary{
		Region:     in.Region,
		Generation: in.Generation,
		BuiltAt:    in.BuiltAt.UTC(),
		BlockSize:  in.BlockSize,
		Scheme:     SchemeChainV1,
		SampleRate: rate,
		Blocks:     blocks,
		Sampled:    uint32(len(keys)),
		Models:     in.Models,
		Load:       in.Load,
		sampler:    s,
		filter:     f,
	}, nil
}

// chooseRate returns the smallest S whose expected sample, with three
// standard deviations of headroom, fits room bytes of filter.
func chooseRate(blocks uint64, room int) uint32 {
	if room <= 0 {
		return math.MaxUint32
	}
	fits := func(rate uint64) bool {
		m := float64(blocks) / float64(rate)
		m += 3 * math.Sqrt(m)
		return fuseBytes(int(math.Ceil(m))) <= room
	}
	rate := max(uint64(float64(blocks)*1.125/float64(room)), 1)
	for !fits(rate) && rate < math.MaxUint32 {
		rate += rate/64 + 1
	}
	for rate > 1 && fits(rate-1) {
		rate--
	}
	return uint32(min(rate, math.MaxUint32))
}

// MayContain reports whether the region may hold block hash h: always true
// for a sampled hash it holds, true with probability about 1/256 for a
// sampled hash it does not, and false for hashes outside the sample.
func (s *Summary) MayContain(h uint64) bool {
	return s.sampler.Keep(h) && s.filter.contains(h)
}

// Sampler returns the summary's sampling rule.
func (s *Summary) Sampler() Sampler { return s.sampler }

// FilterBytes is the size of the fingerprint array.
func (s *Summary) FilterBytes() int { return len(s.filter.fp) }

// Serves reports whether the region serves model (a summary listing no
// models makes no claim and serves every model).
func (s *Summary) Serves(model string) bool {
	if len(s.Models) == 0 {
		return true
	}
	_, ok := slices.BinarySearch(s.Models, model)
	return ok
}

// Totals sums the load over every profile (Profile is the one with the most
// pods, ties to the first by name).
func (s *Summary) Totals() ProfileLoad {
	var t ProfileLoad
	most := -1
	for _, p := range s.Load {
		if p.Pods > most {
			t.Profile, most = p.Profile, p.Pods
		}
		t.Pods += p.Pods
		t.PendingPrefillTokens += p.PendingPrefillTokens
		t.Running += p.Running
		t.Slots += p.Slots
		t.FreeKVBlocks += p.FreeKVBlocks
	}
	return t
}
