package gorgo

import (
	"math"
	"sync"
)

// Calibrator fits each profile's prefill rate and overhead online from
// observed TTFTs, by exponentially weighted least squares of
//
//	ttft - rtt - slot wait = overhead + rate x (uncached tokens + pending prefill tokens ahead)
//
// and publishes the fit to the Model. The fitted rate is clamped to
// [RateBand[0], RateBand[1]] x the profile's default and the overhead to
// [0, 4 x default + 100 ms], so a burst of outliers (a stalled pod, a GC
// pause) cannot move the model far: GORGO's online fit once ran away to
// 77 ms/token. Until MinSamples observations with enough spread in tokens
// have arrived, the defaults stand.
type Calibrator struct {
	model *Model
	cfg   CalibratorConfig
	mu    sync.Mutex
	fits  map[string]*fit
}

// CalibratorConfig tunes the fit.
type CalibratorConfig struct {
	HalfLife   int        // observations after which a sample's weight halves; default 500
	MinSamples int        // before publishing; default 30
	RateBand   [2]float64 // clamp of the fitted rate relative to the default; default [0.25, 4]
}

// DefaultCalibratorConfig returns the defaults documented on CalibratorConfig.
func DefaultCalibratorConfig() CalibratorConfig {
	return CalibratorConfig{HalfLife: 500, MinSamples: 30, RateBand: [2]float64{0.25, 4}}
}

type fit struct {
	n                    int
	sw, sx, sy, sxx, sxy float64
	rate, overhead       float64
	published            bool
}

// NewCalibrator calibrates m's profiles.
func NewCalibrator(m *Model, cfg CalibratorConfig) *Calibrator {
	if cfg.HalfLife <= 0 {
		cfg.HalfLife = 500
	}
	if cfg.MinSamples <= 0 {
		cfg.MinSamples = 30
	}
	if !(cfg.RateBand[0] > 0) || cfg.RateBand[1] < cfg.RateBand[0] {
		cfg.RateBand = [2]float64{0.25, 4}
	}
	return &Calibrator{model: m, cfg: cfg, fits: map[string]*fit{}}
}

// Observation is one served request as the router saw it.
type Observation struct {
	Profile              string
	UncachedTokens       int     // prompt tokens the engine had to prefill (prompt - cached_tokens it reported)
	PendingPrefillTokens int     // prefill work ahead of it when it was routed
	TTFTMs               float64 // observed at the router
	RTTMs                float64 // network time included in TTFTMs
}

// Observe adds one observation and republishes the profile's fit.
func (c *Calibrator) Observe(o Observation) {
	p := c.model.profile(o.Profile)
	x := float64(max(o.UncachedTokens, 0) + max(o.PendingPrefillTokens, 0))
	y := o.TTFTMs - max(o.RTTMs, 0)
	if math.IsNaN(y) || math.IsInf(y, 0) || y < 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.fits[p.Name]
	if f == nil {
		f = &fit{}
		c.fits[p.Name] = f
	}
	decay := math.Exp2(-1 / float64(c.cfg.HalfLife))
	f.sw = f.sw*decay + 1
	f.sx = f.sx*decay + x
	f.sy = f.sy*decay + y
	f.sxx = f.sxx*decay + x*x
	f.sxy = f.sxy*decay + x*y
	f.n++
	if f.n < c.cfg.MinSamples {
		return
	}
	den := f.sw*f.sxx - f.sx*f.sx
	if den <= 1e-9*f.sw*f.sxx { // all x nearly equal: slope not identifiable
		return
	}
	rate := (f.sw*f.sxy - f.sx*f.sy) / den
	overhead := (f.sy - rate*f.sx) / f.sw
	rate = min(max(rate, p.PrefillMsPerToken*c.cfg.RateBand[0]), p.PrefillMsPerToken*c.cfg.RateBand[1])
	overhead = min(max(overhead, 0), 4*p.OverheadMs+100)
	f.rate, f.overhead, f.published = rate, overhead, true
	p.rate.Store(math.Float64bits(rate))
	p.overhead.Store(math.Float64bits(overhead))
}

// Fitted reports, per profile with a published fit, the rate and overhead in
// use, and the number of observations behind them.
type Fitted struct {
	Profile           string  `json:"profile"`
	PrefillMsPerToken float64 `json:"prefill_ms_per_token"`
	OverheadMs        float64 `json:"overhead_ms"`
	DefaultRate       float64 `json:"default_prefill_ms_per_token"`
	Samples           int     `json:"samples"`
}

// Fits returns the published fits.
func (c *Calibrator) Fits() []Fitted {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Fitted
	for name, f := range c.fits {
		if !f.published {
			continue
		}
		p := c.model.profiles[name]
		out = append(out, Fitted{Profile: name, PrefillMsPerToken: f.rate, OverheadMs: f.overhead, DefaultRate: p.PrefillMsPerToken, Samples: f.n})
	}
	return out
}
