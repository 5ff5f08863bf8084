package drill

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Errors of the failover drill. Callers branch on them with errors.Is.
var (
	// ErrConfig wraps every Config.Validate error.
	ErrConfig = errors.New("invalid drill config")
	// ErrRegionNotActive: the region to fail is unknown to the cluster or
	// not active, so the drill does not start.
	ErrRegionNotActive = errors.New("region not active")
	// ErrBaseline: before anything was failed, the probes showed errors or
	// residency violations (or did not complete), so nothing was triggered.
	ErrBaseline = errors.New("baseline unhealthy")
	// ErrNotRecovered: the drill failed the region over and could not make
	// it active again; run `meridian failover recover --region R`.
	ErrNotRecovered = errors.New("region not recovered")
)

// ProbeTenant is the tenant of the default public and pii probes.
const ProbeTenant = "dr-drill"

// Probe is one kind of probe request: a chat completion sent to the
// controller of Origin with X-Tenant-Id Tenant and X-Data-Class DataClass
// (either may be empty: the header is then left out).
type Probe struct {
	Origin    string `json:"origin"`
	Tenant    string `json:"tenant"`
	DataClass string `json:"data_class"`
}

// String renders the probe as origin:tenant:class, the form ParseProbe reads.
func (p Probe) String() string { return p.Origin + ":" + p.Tenant + ":" + p.DataClass }

// ParseProbe reads origin:tenant:class (tenant and class may be empty, the
// origin may not).
func ParseProbe(s string) (Probe, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return Probe{}, fmt.Errorf("probe %q: want origin:tenant:class", s)
	}
	p := Probe{Origin: strings.TrimSpace(parts[0]), Tenant: strings.TrimSpace(parts[1]), DataClass: strings.TrimSpace(parts[2])}
	if p.Origin == "" {
		return Probe{}, fmt.Errorf("probe %q: the origin region is empty", s)
	}
	return p, nil
}

// DefaultProbes returns, for every region (sorted), a public and a pii
// probe of ProbeTenant and a phi probe of the EU health tenant (eu-health),
// whose data the example policy keeps in the EU.
func DefaultProbes(regions []string) []Probe {
	regions = slices.Sorted(slices.Values(regions))
	out := make([]Probe, 0, 3*len(regions))
	for _, r := range regions {
		out = append(out,
			Probe{Origin: r, Tenant: ProbeTenant, DataClass: "public"},
			Probe{Origin: r, Tenant: ProbeTenant, DataClass: "pii"},
			Probe{Origin: r, Tenant: "eu-health", DataClass: "phi"})
	}
	return out
}

// Config describes one failover drill. Start from DefaultConfig.
type Config struct {
	// Admin is the admin API base URL of any controller (required).
	Admin string
	// Token is the admin bearer token (required).
	Token string
	// Controllers maps a region to its controller's public base URL; the
	// probes of an origin are sent there (required, at least one).
	Controllers map[string]string
	// Region is the region to fail over and recover (required).
	Region string
	// Drain drains the region (no new traffic, requests in flight finish)
	// instead of failing it.
	Drain bool
	// DefaultProbes adds DefaultProbes of the Controllers' regions.
	// Default true.
	DefaultProbes bool
	// Probes are sent besides the default ones (duplicates are dropped).
	Probes []Probe
	// Model named in the probe requests. Default "meridian/sim-70b" (the
	// demo's model).
	Model string
	// Interval is the time between two requests of one probe (each probe
	// has at most one request in flight). Default 100ms.
	Interval time.Duration
	// ProbeTimeout bounds one probe request. Default 5s.
	ProbeTimeout time.Duration
	// BaselineRounds is how many requests of each probe record the
	// baseline before the trigger. Default 3.
	BaselineRounds int
	// BaselineTimeout bounds the baseline. Default 30s.
	BaselineTimeout time.Duration
	// Hold is how long traffic must stay moved (and then back) before the
	// drill recovers the region (and then ends). Default 2s.
	Hold time.Duration
	// TargetMoved: every affected probe must be served as the policy allows
	// without the region within this time of the trigger returning.
	// Default 5s.
	TargetMoved time.Duration
	// TargetBack: every affected probe must be served as in the baseline
	// within this time of the recovery returning. Default 10s.
	TargetBack time.Duration
	// MovedTimeout is how long after the trigger returned the drill waits
	// for traffic to move before it recovers the region anyway (and fails).
	// Default 60s; at least TargetMoved.
	MovedTimeout time.Duration
	// BackTimeout is how long after the recovery returned the drill waits
	// for traffic to come back. Default 60s; at least TargetBack.
	BackTimeout time.Duration
	// AdminTimeout bounds each admin API call. Default 30s.
	AdminTimeout time.Duration
	// MaxErrors: the drill passes only with at most this many probe errors.
	// Negative: errors are counted and reported, not judged. Default -1.
	MaxErrors int
	// Reason and Actor are recorded with the failover and the recovery.
	// Defaults "dr drill" and "meridian-dr-drill".
	Reason, Actor string
	// Force fails the region over even when that leaves some traffic with
	// no region its residency policy allows (the cluster refuses it
	// otherwise, naming that traffic).
	Force bool
	// HTTP is the client of the probes and the admin API; nil: a client of
	// the drill's own, whose idle connections are closed at the end.
	HTTP *http.Client
	// Logger; nil discards.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		DefaultProbes:   true,
		Model:           "meridian/sim-70b",
		Interval:        100 * time.Millisecond,
		ProbeTimeout:    5 * time.Second,
		BaselineRounds:  3,
		BaselineTimeout: 30 * time.Second,
		Hold:            2 * time.Second,
		TargetMoved:     5 * time.Second,
		TargetBack:      10 * time.Second,
		MovedTimeout:    60 * time.Second,
		BackTimeout:     60 * time.Second,
		AdminTimeout:    30 * time.Second,
		MaxErrors:       -1,
		Reason:          "dr drill",
		Actor:           "meridian-dr-drill",
	}
}

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
}

func checkBaseURL(field, s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return configErr("%s: %q is not an http:// or https:// URL", field, s)
	}
	return nil
}

// Validate returns an error (wrapping ErrConfig) naming the first
// invalid field.
func (c Config) Validate() error {
	if c.Admin == "" {
		return configErr("Admin: required (the admin API URL of any controller)")
	}
	if err := checkBaseURL("Admin", c.Admin); err != nil {
		return err
	}
	if c.Token == "" {
		return configErr("Token: required")
	}
	if len(c.Controllers) == 0 {
		return configErr("Controllers: at least one region=URL is required")
	}
	for _, r := range slices.Sorted(maps.Keys(c.Controllers)) {
		if r == "" {
			return configErr("Controllers: empty region name")
		}
		if err := checkBaseURL("Controllers["+r+"]", c.Controllers[r]); err != nil {
			return err
		}
	}
	if c.Region == "" {
		return configErr("Region: required (the region to fail over)")
	}
	for _, p := range c.Probes {
		if p.Origin == "" {
			return configErr("Probes: %q has no origin region", p.String())
		}
		if _, ok := c.Controllers[p.Origin]; !ok {
			return configErr("Probes: %q: no controller URL for origin %s (known: %s)", p.String(), p.Origin, strings.Join(slices.Sorted(maps.Keys(c.Controllers)), ", "))
		}
	}
	if !c.DefaultProbes && len(c.Probes) == 0 {
		return configErr("Probes: none (DefaultProbes is off and no probe is listed)")
	}
	if c.Model == "" {
		return configErr("Model: required")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Interval", c.Interval}, {"ProbeTimeout", c.ProbeTimeout}, {"BaselineTimeout", c.BaselineTimeout},
		{"TargetMoved", c.TargetMoved}, {"TargetBack", c.TargetBack}, {"MovedTimeout", c.MovedTimeout},
		{"BackTimeout", c.BackTimeout}, {"AdminTimeout", c.AdminTimeout}} {
		if d.v <= 0 {
			return configErr("%s: %v, want more than 0", d.name, d.v)
		}
	}
	if c.Hold < 0 {
		return configErr("Hold: %v, want at least 0", c.Hold)
	}
	if c.BaselineRounds < 1 {
		return configErr("BaselineRounds: %d, want at least 1", c.BaselineRounds)
	}
	if c.MovedTimeout < c.TargetMoved {
		return configErr("MovedTimeout: %v is shorter than TargetMoved %v", c.MovedTimeout, c.TargetMoved)
	}
	if c.BackTimeout < c.TargetBack {
		return configErr("BackTimeout: %v is shorter than TargetBack %v", c.BackTimeout, c.TargetBack)
	}
	return nil
}

// probes returns the default probes (if enabled) and the listed ones,
// without duplicates, in that order.
func (c Config) probes() []Probe {
	var out []Probe
	seen := map[Probe]bool{}
	add := func(p Probe) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	if c.DefaultProbes {
		for _, p := range DefaultProbes(slices.Collect(maps.Keys(c.Controllers))) {
			add(p)
		}
	}
	for _, p := range c.Probes {
		add(p)
	}
	return out
}
