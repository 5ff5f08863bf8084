package check

import (
	"fmt"
	"runtime"
)

// ChecksumMode says which files a check hashes with SHA-256. Hashing reads
// every byte, so on a multi-GB model it dominates the run time; everything
// else reads only headers and small files.
type ChecksumMode int

const (
	// ChecksumAuto verifies the checksums the manifest records and, when
	// comparing regions, hashes files of at most SmallFileBytes; larger files
	// are compared by size and, for safetensors, by header.
	ChecksumAuto ChecksumMode = iota
	// ChecksumAlways hashes every file: recorded checksums are verified and
	// regions are compared byte for byte.
	ChecksumAlways
	// ChecksumNever hashes nothing, not even files whose checksum the
	// manifest records.
	ChecksumNever
)

func (m ChecksumMode) String() string {
	switch m {
	case ChecksumAuto:
		return "auto"
	case ChecksumAlways:
		return "always"
	case ChecksumNever:
		return "never"
	}
	return fmt.Sprintf("checksum-mode(%d)", int(m))
}

// ParseChecksumMode parses "auto", "always" or "never".
func ParseChecksumMode(s string) (ChecksumMode, error) {
	switch s {
	case "auto", "":
		return ChecksumAuto, nil
	case "always":
		return ChecksumAlways, nil
	case "never":
		return ChecksumNever, nil
	}
	return 0, fmt.Errorf("checksum mode %q: want auto, always or never", s)
}

// Config tunes a check. The zero value is not valid; start from DefaultConfig.
type Config struct {
	// Checksums selects which files are hashed. Default ChecksumAuto.
	Checksums ChecksumMode
	// Workers bounds how many files are read at once (shard headers and
	// hashes). Default runtime.GOMAXPROCS(0).
	Workers int
	// SmallFileBytes: in a region comparison under ChecksumAuto, files of at
	// most this many bytes are hashed. Default 16 MiB.
	SmallFileBytes int64
	// MaxParseBytes: JSON, YAML and text files larger than this are not
	// parsed (a finding says so). Default 512 MiB.
	MaxParseBytes int64
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Checksums:      ChecksumAuto,
		Workers:        runtime.GOMAXPROCS(0),
		SmallFileBytes: 16 << 20,
		MaxParseBytes:  512 << 20,
	}
}

// Validate returns an error naming the first invalid field.
func (c Config) Validate() error {
	switch c.Checksums {
	case ChecksumAuto, ChecksumAlways, ChecksumNever:
	default:
		return fmt.Errorf("dr config: Checksums: unknown mode %d", int(c.Checksums))
	}
	if c.Workers < 1 {
		return fmt.Errorf("dr config: Workers: %d, want at least 1", c.Workers)
	}
	if c.SmallFileBytes < 0 {
		return fmt.Errorf("dr config: SmallFileBytes: %d, want at least 0", c.SmallFileBytes)
	}
	if c.MaxParseBytes < 1 {
		return fmt.Errorf("dr config: MaxParseBytes: %d, want at least 1", c.MaxParseBytes)
	}
	return nil
}
