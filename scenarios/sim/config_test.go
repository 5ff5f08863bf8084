package sim

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	good := func() Config {
		c := DefaultConfig()
		c.Workload.Kind = WorkloadShort
		return c
	}
	if c := good(); c.Validate() != nil {
		t.Fatalf("default config: %v", c.Validate())
	}
	for _, tc := range []struct {
		field string
		mod   func(*Config)
	}{
		{"Fleet.Regions", func(c *Config) { c.Fleet.Regions = nil }},
		{"Fleet.Regions[1]", func(c *Config) { c.Fleet.Regions = []string{"a", "a"} }},
		{"Fleet.PodsPerRegion", func(c *Config) { c.Fleet.PodsPerRegion = 0 }},
		{"Fleet.Profiles[0]", func(c *Config) { c.Fleet.Profiles = []string{"a100"} }},
		{"Fleet.CacheTokens", func(c *Config) { c.Fleet.CacheTokens = -1 }},
		{"Fleet.BlockSize", func(c *Config) { c.Fleet.BlockSize = 0 }},
		{"Fleet.RTT", func(c *Config) { c.Fleet.RTT = [][]time.Duration{{0}} }},
		{"Fleet.RTT[0][0]", func(c *Config) { c.Fleet.RTT = DefaultRTT(c.Fleet.Regions); c.Fleet.RTT[0][0] = 1 }},
		{"Workload.Kind", func(c *Config) { c.Workload.Kind = "chat" }},
		{"Workload.Trace", func(c *Config) { c.Workload.Kind = WorkloadTrace }},
		{"Workload.TimeScale", func(c *Config) { c.Workload.TimeScale = 0 }},
		{"Workload.Duration", func(c *Config) { c.Workload.Duration = 0 }},
		{"Workload.Load", func(c *Config) { c.Workload.Load = -0.1 }},
		{"Workload.Window", func(c *Config) { c.Workload.Window = 1.5 }},
		{"Workload.RoamShare", func(c *Config) { c.Workload.RoamShare = -1 }},
		{"Workload.FailRegion", func(c *Config) { c.Workload.FailRegion = "mars-1" }},
		{"Workload.FailTo", func(c *Config) { c.Workload.FailRegion, c.Workload.FailFrom, c.Workload.FailTo = "us-west-2", 0.5, 0.4 }},
		{"ModelError", func(c *Config) { c.ModelError = 1 }},
		{"Workload.OriginShares", func(c *Config) { c.Workload.OriginShares = []float64{1} }},
		{"Workload.OriginShares[1]", func(c *Config) { c.Workload.OriginShares = []float64{1, -1, 1} }},
		{"Workload.ClassShares", func(c *Config) { c.Workload.ClassShares = map[string]float64{"phi": 0} }},
		{"Workload.EUHealthShare", func(c *Config) { c.Workload.EUHealthShare = 2 }},
		{"Policies[0]", func(c *Config) { c.Policies = []string{"random"} }},
		{"Policies[1]", func(c *Config) { c.Policies = []string{PolicyMeridian, PolicyMeridian} }},
		{"EventDelayMax", func(c *Config) { c.EventDelayMax = c.EventDelayMin - 1 }},
		{"SummaryInterval", func(c *Config) { c.SummaryInterval = 0 }},
		{"Decision", func(c *Config) { c.Decision.Policy = "x" }},
		{"Gorgo", func(c *Config) { c.Gorgo.QueueWeight = -1 }},
	} {
		c := good()
		tc.mod(&c)
		err := c.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field+" ") && !strings.Contains(err.Error(), tc.field+":") {
			t.Errorf("%s: error %v, want ErrInvalidConfig naming the field", tc.field, err)
		}
	}
}

func TestDefaultRTT(t *testing.T) {
	regions := RegionNames(5)
	m := DefaultRTT(regions)
	want := map[[2]int]time.Duration{{0, 1}: 65 * time.Millisecond, {0, 2}: 75 * time.Millisecond, {1, 2}: 130 * time.Millisecond,
		{0, 3}: 220 * time.Millisecond, {2, 3}: 220 * time.Millisecond, {0, 4}: 150 * time.Millisecond}
	for k, v := range want {
		if m[k[0]][k[1]] != v || m[k[1]][k[0]] != v {
			t.Errorf("%s<->%s = %v/%v, want %v", regions[k[0]], regions[k[1]], m[k[0]][k[1]], m[k[1]][k[0]], v)
		}
	}
	for i := range regions {
		if m[i][i] != 0 {
			t.Errorf("%s to itself: %v", regions[i], m[i][i])
		}
	}
}
