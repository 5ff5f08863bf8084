package gorgo

import (
	"math"
	"sort"
	"sync"
)

// Calibrator corrects the model's prefill speed online from observed
// TTFTs, by exponentially weighted least squares of
//
//	ttft - rtt = overhead + rate x work
//
// where work is the request's prefill in token equivalents (its uncached
// tokens, with attention when the profile has AttnTokens) plus the pending
// prefill ahead of it. An observation that names its pod feeds two fits:
// the pod's own and the pool of its profile's pods. A pod's published
// correction is the pool's factor times the pod's own departure from the
// pool, shrunk by ShrinkZ of its standard errors: pods of one profile that
// merely saw different luck (a burst of long contexts decoding beside
// their prefills) keep one rate, so a decision does not move a session off
// the pod that caches it for a difference that is noise, while a pod that
// is really off its profile (a throttled GPU, a different engine build)
// gets its own. The pool sets no rate of its own: the profile's rate also
// prices other regions' pods (whose load this controller's observations
// do not show); only observations that name no pod move it. Each fit moves
// the model only under four rules, so that it can correct a model that is
// off without ever steering decisions by noise or load (at load the
// observed TTFT holds queueing the model does not see, and an unbounded
// fit chases it: GORGO's online fit ran away to 77 ms/token, and ours made
// short prompts at load 0.9 3-6x worse):
//
//   - Outlier rejection: once a fit has MinSamples, an observation whose
//     residual exceeds OutlierK x its robust scale (1.4826 x the weighted
//     mean absolute residual, at least 10% of the prediction + 5 ms) is
//     counted and dropped.
//   - Confidence: a fit counts in proportion to its effective samples and
//     to how well the slope is determined: 0 at a relative standard error
//     of MaxRelSE or more, 1 when exact.
//   - A band: each factor (the pool's, a pod's departure from it, and
//     their product, which is published) stays in [RateBand[0],
//     RateBand[1]].
//   - Bounded steps: a fit's factor moves at most MaxStep (relative) per
//     observation it takes, toward 1 + confidence x (the banded factor -
//     1), so a pod's published factor moves at most that per observation
//     of its profile.
//
// The overhead is not calibrated: it is small and its fit absorbs whatever
// the slope does not explain.
type Calibrator struct {
	model *Model
	cfg   CalibratorConfig
	mu    sync.Mutex
	fits  map[fitKey]*fit
}

// fitKey names a fit: a pod's (pod set), the pool of a profile's pods
// (pooled), or the profile's from observations that name no pod.
type fitKey struct {
	profile, pod string
	pooled       bool
}

// CalibratorConfig tunes the fit and its rules.
type CalibratorConfig struct {
	HalfLife   int        // observations after which a sample's weight halves; default 500
	MinSamples int        // before a fit counts or rejects; default 30
	RateBand   [2]float64 // the published factor's band; default [0.67, 1.5]
	MaxStep    float64    // largest relative move of a published factor per observation; default 0.01
	OutlierK   float64    // rejection threshold in robust scales; default 4
	MaxRelSE   float64    // relative standard error of the slope at which confidence is 0; default 0.25
	// ShrinkZ is how many of its standard errors a pod's fitted rate must
	// be from its profile's pooled rate before any of the difference is
	// published; default 2 (negative: no shrinkage).
	ShrinkZ float64
}

// DefaultCalibratorConfig returns the defaults documented on CalibratorConfig.
func DefaultCalibratorConfig() CalibratorConfig {
	return CalibratorConfig{HalfLife: 500, MinSamples: 30, RateBand: [2]float64{0.67, 1.5}, MaxStep: 0.01, OutlierK: 4, MaxRelSE: 0.25, ShrinkZ: 2}
}

type fit struct {
	n, rejected               int
	sw, sx, sy, sxx, sxy, syy float64
	absDev                    float64 // weighted mean absolute residual
	se                        float64 // standard error of the fitted rate
	rate, overhead            float64 // the current fit
	valid                     bool
	confidence                float64
	factor                    float64 // published
}

// NewCalibrator calibrates m's profiles and pods.
func NewCalibrator(m *Model, cfg CalibratorConfig) *Calibrator {
	d := DefaultCalibratorConfig()
	if cfg.HalfLife <= 0 {
		cfg.HalfLife = d.HalfLife
	}
	if cfg.MinSamples <= 0 {
		cfg.MinSamples = d.MinSamples
	}
	if !(cfg.RateBand[0] > 0) || !(cfg.RateBand[1] >= cfg.RateBand[0]) {
		cfg.RateBand = d.RateBand
	}
	if !(cfg.MaxStep > 0) {
		cfg.MaxStep = d.MaxStep
	}
	if !(cfg.OutlierK > 0) {
		cfg.OutlierK = d.OutlierK
	}
	if !(cfg.MaxRelSE > 0) {
		cfg.MaxRelSE = d.MaxRelSE
	}
	if cfg.ShrinkZ == 0 || math.IsNaN(cfg.ShrinkZ) {
		cfg.ShrinkZ = d.ShrinkZ
	}
	return &Calibrator{model: m, cfg: cfg, fits: map[fitKey]*fit{}}
}

// Observation is one served request as the router saw it.
type Observation struct {
	Profile              string
	Pod                  string  // the pod that served it; "": calibrate the profile
	UncachedTokens       int     // prompt tokens the engine had to prefill (prompt - cached_tokens it reported)
	CachedTokens         int     // prompt tokens served from cache (for the attention term)
	PendingPrefillTokens int     // prefill work ahead of it when it was routed
	TTFTMs               float64 // observed at the router
	RTTMs                float64 // network time included in TTFTMs
}

// work is an observation's prefill in token equivalents at the profile's
// nominal rate.
func work(p *profileState, o Observation) float64 {
	return prefillMs(p.AttnTokens, 1, o.CachedTokens, o.UncachedTokens) + float64(max(o.PendingPrefillTokens, 0))
}

// Observe adds one observation and republishes its pod's correction (or,
// with no pod, the profile's rate).
func (c *Calibrator) Observe(o Observation) {
	p := c.model.profile(o.Profile)
	x := work(p, o)
	y := o.TTFTMs - max(o.RTTMs, 0)
	if math.IsNaN(y) || math.IsInf(y, 0) || y < 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if o.Pod == "" {
		// No pod: the profile's own fit sets the profile's rate.
		f := c.fit(fitKey{profile: p.Name})
		if f.observe(c.cfg, x, y) {
			f.publish(c.cfg, p.PrefillMsPerToken, 0)
			p.rate.Store(math.Float64bits(p.PrefillMsPerToken * f.factor))
		}
		return
	}
	// The pool of the profile's pods takes every observation with a pod;
	// it is the reference of each pod's own fit, and sets no rate itself:
	// the profile's rate also prices other regions' pods, whose load this
	// controller's observations do not show.
	pool := c.fit(fitKey{profile: p.Name, pooled: true})
	if pool.observe(c.cfg, x, y) {
		pool.publish(c.cfg, p.PrefillMsPerToken, 0)
	}
	// A pod's correction is the pool's times its own departure from the
	// pool, less what its own standard error leaves unproven; the product
	// stays in the band.
	f := c.fit(fitKey{profile: p.Name, pod: o.Pod})
	if f.observe(c.cfg, x, y) {
		f.publish(c.cfg, p.PrefillMsPerToken*pool.factor, c.cfg.ShrinkZ)
	}
	if f.n >= c.cfg.MinSamples || pool.n >= c.cfg.MinSamples {
		c.model.pods.set(o.Pod, min(max(pool.factor*f.factor, c.cfg.RateBand[0]), c.cfg.RateBand[1]))
	}
}

// fit returns the fit under key, made on first use.
func (c *Calibrator) fit(key fitKey) *fit {
	f := c.fits[key]
	if f == nil {
		f = &fit{factor: 1}
		c.fits[key] = f
	}
	return f
}

// observe applies the outlier rule and folds the observation in; it
// reports whether the fit has enough samples to publish.
func (f *fit) observe(cfg CalibratorConfig, x, y float64) bool {
	if !f.accept(cfg, x, y) {
		return false
	}
	f.add(cfg, x, y)
	if f.n < cfg.MinSamples {
		return false
	}
	f.solve(cfg)
	return true
}

// scale is the robust scale of the fit's residuals at prediction pred.
func (f *fit) scale(pred float64) float64 {
	return max(1.4826*f.absDev, 0.1*math.Abs(pred)+5)
}

// accept applies the outlier rule.
func (f *fit) accept(cfg CalibratorConfig, x, y float64) bool {
	if !f.valid || f.n < cfg.MinSamples {
		return true
	}
	pred := f.overhead + f.rate*x
	if math.Abs(y-pred) > cfg.OutlierK*f.scale(pred) {
		f.rejected++
		return false
	}
	return true
}

// add folds an accepted observation into the decayed sums and the residual
// scale.
func (f *fit) add(cfg CalibratorConfig, x, y float64) {
	decay := math.Exp2(-1 / float64(cfg.HalfLife))
	if f.valid {
		f.absDev = f.absDev*decay + (1-decay)*math.Abs(y-(f.overhead+f.rate*x))
	}
	f.sw = f.sw*decay + 1
	f.sx = f.sx*decay + x
	f.sy = f.sy*decay + y
	f.sxx = f.sxx*decay + x*x
	f.sxy = f.sxy*decay + x*y
	f.syy = f.syy*decay + y*y
	f.n++
}

// solve refits the line and its confidence.
func (f *fit) solve(cfg CalibratorConfig) {
	den := f.sw*f.sxx - f.sx*f.sx
	if den <= 1e-9*f.sw*f.sxx { // all x nearly equal: slope not identifiable
		f.confidence = 0
		return
	}
	rate := (f.sw*f.sxy - f.sx*f.sy) / den
	overhead := (f.sy - rate*f.sx) / f.sw
	if !f.valid {
		// The first fit seeds the residual scale.
		f.absDev = math.Sqrt(max(f.sse(rate, overhead)/f.sw, 0)) * 0.8
	}
	f.rate, f.overhead, f.valid = rate, overhead, true
	// Standard error of the slope from the weighted residuals.
	neff := f.sw
	if neff <= 2 || rate <= 0 {
		f.confidence = 0
		return
	}
	s2 := max(f.sse(rate, overhead), 0) / (neff - 2)
	se := math.Sqrt(s2 * f.sw / den)
	f.se = se
	rel := se / rate
	f.confidence = neff / (neff + float64(cfg.MinSamples)) * max(0, 1-rel/cfg.MaxRelSE)
}

// sse is the weighted sum of squared residuals of a line.
func (f *fit) sse(rate, overhead float64) float64 {
	// sum w (y - o - r x)^2 from the moments.
	return f.syy + overhead*overhead*f.sw + rate*rate*f.sxx - 2*overhead*f.sy - 2*rate*f.sxy + 2*overhead*rate*f.sx
}

// publish moves the published factor one bounded step toward the
// confident, banded fit against ref (the rate the factor multiplies). With
// z > 0 the fit's departure from ref is first shrunk by z standard
// errors: a difference the fit cannot tell from noise publishes nothing.
func (f *fit) publish(cfg CalibratorConfig, ref float64, z float64) {
	target := 1.0
	if f.valid && f.rate > 0 {
		d := f.rate/ref - 1
		if z > 0 && f.se > 0 { // an exact fit (se 0) proves its departure, whatever z
			d = math.Copysign(max(math.Abs(d)-z*f.se/ref, 0), d)
		}
		banded := min(max(1+d, cfg.RateBand[0]), cfg.RateBand[1])
		target = 1 + f.confidence*(banded-1)
	}
	step := min(max(target/f.factor, 1-cfg.MaxStep), 1+cfg.MaxStep)
	f.factor = min(max(f.factor*step, cfg.RateBand[0]), cfg.RateBand[1])
}

// Fitted reports one fit: the rate in use (the profile's rate times the
// published factor), the raw fit, and its standing.
type Fitted struct {
	Profile           string  `json:"profile"`
	Pod               string  `json:"pod,omitempty"`
	Pooled            bool    `json:"pooled,omitempty"` // the pool of the profile's pods, each pod's reference
	PrefillMsPerToken float64 `json:"prefill_ms_per_token"`
	Factor            float64 `json:"factor"`
	FittedMsPerToken  float64 `json:"fitted_ms_per_token"`
	OverheadMs        float64 `json:"overhead_ms"`
	DefaultRate       float64 `json:"default_prefill_ms_per_token"`
	Confidence        float64 `json:"confidence"`
	Samples           int     `json:"samples"`
	Rejected          int     `json:"rejected"`
}

// Fits returns every fit with enough samples, by profile then pod.
func (c *Calibrator) Fits() []Fitted {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Fitted
	for k, f := range c.fits {
		if !f.valid {
			continue
		}
		p := c.model.profiles[k.profile]
		factor := f.factor
		if k.pod != "" {
			factor = c.model.PodFactor(k.pod)
		}
		out = append(out, Fitted{Profile: k.profile, Pod: k.pod, Pooled: k.pooled, PrefillMsPerToken: p.PrefillMsPerToken * factor, Factor: factor,
			FittedMsPerToken: f.rate, OverheadMs: f.overhead, DefaultRate: p.PrefillMsPerToken, Confidence: f.confidence,
			Samples: f.n, Rejected: f.rejected})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Profile != out[j].Profile {
			return out[i].Profile < out[j].Profile
		}
		if out[i].Pooled != out[j].Pooled {
			return !out[i].Pooled
		}
		return out[i].Pod < out[j].Pod
	})
	return out
}
