package index

import (
	"errors"
	"fmt"
)

// MaxPods is the largest pod capacity an index can be built with.
const MaxPods = 1024

// maxExpectedBlocks bounds the ExpectedBlocks hint (1<<36, 68.7 billion).
const maxExpectedBlocks = 1 << 36

// maxWords is the bitmap width, in 64-bit words, at MaxPods.
const maxWords = MaxPods / 64

// Config sizes an index. The zero value is not valid; start from DefaultConfig.
type Config struct {
	// PodCapacity is the number of pod slots, a multiple of 64 between 64 and
	// MaxPods. It fixes the width of every block's pod bitmap, so memory per
	// indexed block grows with it (8 bytes per 64 pods). Default 256.
	PodCapacity int
	// ExpectedBlocks pre-sizes the tables so that this many distinct blocks
	// fit without growing (a fleet's KV capacity in blocks is a good value).
	// A shard's table grows incrementally (a few slots copied per insertion,
	// see startGrow), so growth never stalls ingestion for a whole rehash,
	// but presizing saves the copying and the memory of two tables while
	// one grows. 0, the default, starts small and grows on demand; the
	// slots cost 8 bytes each up front.
	ExpectedBlocks int
}

// DefaultConfig returns the configuration the benchmarks use: 256 pods.
func DefaultConfig() Config { return Config{PodCapacity: 256} }

// ErrInvalidConfig is wrapped by every error Validate returns.
var ErrInvalidConfig = errors.New("invalid index config")

// Validate reports the first field that is out of range, naming it and its value.
func (c Config) Validate() error {
	if c.PodCapacity < 64 || c.PodCapacity > MaxPods || c.PodCapacity%64 != 0 {
		return fmt.Errorf("%w: PodCapacity = %d, want a multiple of 64 in [64, %d]", ErrInvalidConfig, c.PodCapacity, MaxPods)
	}
	if c.ExpectedBlocks < 0 || c.ExpectedBlocks > maxExpectedBlocks {
		return fmt.Errorf("%w: ExpectedBlocks = %d, want 0 to %d", ErrInvalidConfig, c.ExpectedBlocks, maxExpectedBlocks)
	}
	return nil
}

// Tier is where a pod holds a block. Lower is faster.
type Tier uint8

// The storage tiers of a cached block, in the order a match is preferred.
const (
	TierGPU Tier = iota
	TierCPU
	TierDisk
	TierExternal
	NumTiers
)

var tierNames = [NumTiers]string{"gpu", "cpu", "disk", "external"}

func (t Tier) String() string {
	if t < NumTiers {
		return tierNames[t]
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// ParseTier maps a tier name ("gpu", "cpu", "disk", "external") to its Tier.
func ParseTier(s string) (Tier, bool) {
	for i, n := range tierNames {
		if n == s {
			return Tier(i), true
		}
	}
	return 0, false
}
