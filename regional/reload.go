package regional

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional/auth"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/residency"
)

// A running controller follows changes to its configuration: on Reload
// (SIGHUP), and when the watch (reload.watch_interval) sees the content of
// the configuration file or of a file it names change. What can change
// live does, atomically: every part is read and checked first, and one
// that does not load leaves all of them as they were (the error is logged,
// and meridian_config_reloads_total{result="error"} counts it). The parts:
//
//   - policy_file, for a controller without Raft (with Raft the active
//     policy is the committed one: meridian policy apply changes it);
//   - pods.static and pods.allowed_endpoints;
//   - the decision section (but for route.RestartKeys);
//   - the API keys file or JWKS file (auth);
//   - the TLS certificate, key and CA files (tls), used from the next
//     handshake on.
//
// A policy or API keys change is recorded in the audit log (policy_reload,
// api_keys_reload) before it takes effect, and not made when the record
// cannot be written. Any other key that changed takes effect at the next
// start: the reload names it (meridian_config_restart_pending counts them).

// Audit actions of a reload (audit.AdminDetail.Action).
const (
	ActionPolicyReload  = "policy_reload"
	ActionAPIKeysReload = "api_keys_reload"
)

// ReloadConfig is how the controller follows changes to its files.
type ReloadConfig struct {
	// WatchInterval is how often the configuration file and the files it
	// names (policy_file, the API keys or JWKS file, the TLS files) are
	// read to see whether their content changed; a change reloads the
	// configuration. 0 turns the watch off (SIGHUP still reloads). Default
	// 5s; at least 100ms.
	WatchInterval time.Duration `yaml:"watch_interval"`
}

// DefaultWatchInterval is ReloadConfig.WatchInterval's default.
const DefaultWatchInterval = 5 * time.Second

func (r ReloadConfig) validate() error {
	if d := r.WatchInterval; d < 0 || (d > 0 && d < 100*time.Millisecond) {
		return fmt.Errorf("config: reload.watch_interval = %v: want 0 (off) or at least 100ms", d)
	}
	return nil
}

// ReloadResult is what one reload did.
type ReloadResult struct {
	// Trigger is what asked for it: "signal" (SIGHUP) or "watch".
	Trigger string
	// Changed names the parts that changed: policy, pods.static,
	// pods.allowed_endpoints, decision, api_keys, jwks, tls.
	Changed []string
	// RestartPending names the keys whose new value takes effect at the
	// next start (those changed since the controller started).
	RestartPending []string
	// Notes says what else the operator should know (a policy file changed
	// under Raft).
	Notes []string
}

// reloader is a controller's reload state. Reloads run one at a time.
type reloader struct {
	mu sync.Mutex
	// running is the configuration in force: the one the controller
	// started with, with the live parts of every reload since.
	running   Config
	policySum [sha256.Size]byte // of the policy file in force (zero: none)
	// watched is the digest of every watched file as the controller
	// started (the watch's first reference).
	watched map[string]string
	m       *reloadMetrics
	// done is closed at the end of the next reload (tests and the watch
	// wait on it).
	done chan struct{}
}

type reloadMetrics struct {
	reloads *prometheus.CounterVec
	pending prometheus.Gauge
}

func newReloadMetrics(reg prometheus.Registerer) (*reloadMetrics, error) {
	m := &reloadMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_config_reloads_total",
			Help: "Configuration reloads (SIGHUP, or a watched file whose content changed), by result: ok, or error (nothing changed: the running configuration stays in force)."},
			[]string{"result"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_config_restart_pending",
			Help: "Configuration keys changed in the file since the controller started that take effect only at the next start."}),
	}
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("error")
	for _, c := range []prometheus.Collector{m.reloads, m.pending} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register reload metrics: %w", err)
		}
	}
	return m, nil
}

// Reloaded returns a channel closed when the next reload ends (whatever
// its result).
func (c *Controller) Reloaded() <-chan struct{} {
	c.reload.mu.Lock()
	defer c.reload.mu.Unlock()
	if c.reload.done == nil {
		c.reload.done = make(chan struct{})
	}
	return c.reload.done
}

// Reload reads the configuration again (Deps.LoadConfig) and applies what
// can change live; see the list at the top of reload.go. It is atomic: an
// error (a file that does not load, an invalid configuration, a change
// whose audit record could not be written) leaves everything as it was.
func (c *Controller) Reload(ctx context.Context, trigger string) (ReloadResult, error) {
	r := &c.reload
	r.mu.Lock()
	defer r.mu.Unlock()
	defer func() {
		if r.done != nil {
			close(r.done)
			r.done = nil
		}
	}()
	res, err := c.reloadLocked(ctx, trigger)
	if err != nil {
		r.m.reloads.WithLabelValues("error").Inc()
		c.log.Error("configuration not reloaded; the running configuration stays in force", "trigger", trigger, "err", err)
		return res, err
	}
	r.m.reloads.WithLabelValues("ok").Inc()
	r.m.pending.Set(float64(len(res.RestartPending)))
	args := []any{"trigger", trigger, "changed", res.Changed}
	if len(res.RestartPending) > 0 {
		args = append(args, "restart_pending", res.RestartPending)
	}
	msg := "configuration reloaded"
	if len(res.Changed) == 0 {
		msg = "configuration reloaded: nothing to change"
	}
	c.log.Info(msg, args...)
	if len(res.RestartPending) > 0 {
		c.log.Warn("configuration keys changed that take effect only at the next start", "keys", res.RestartPending)
	}
	for _, n := range res.Notes {
		c.log.Warn(n)
	}
	return res, nil
}

// nextConfig reads the configuration for a reload.
func (c *Controller) nextConfig() (Config, error) {
	var next Config
	var err error
	switch {
	case c.deps.LoadConfig != nil:
		next, err = c.deps.LoadConfig()
	case c.deps.ConfigFile != "":
		next, err = LoadConfig(c.deps.ConfigFile)
		next.ApplyEnv(os.Getenv)
	default:
		next = c.reload.running
	}
	if err != nil {
		return next, err
	}
	next.ApplyDefaults()
	if err := next.Validate(); err != nil {
		return next, err
	}
	return next, nil
}

func (c *Controller) reloadLocked(ctx context.Context, trigger string) (ReloadResult, error) {
	r := &c.reload
	res := ReloadResult{Trigger: trigger}
	next, err := c.nextConfig()
	if err != nil {
		return res, err
	}
	running := r.running
	inForce := running

	// Read and check every part before changing any.
	var (
		newPolicy *residency.Policy
		policyDoc []byte
		policySum [sha256.Size]byte
		setPolicy bool
		static    = running.Pods.Static
		setStatic bool
		allowed   bool
		decision  route.Config
		setDec    bool
		keys      *auth.Update
		tlsUp     *identity.Update
	)
	sc, _ := c.control().(*StaticControl)
	if next.PolicyFile != "" {
		if newPolicy, policyDoc, err = next.loadPolicy(); err != nil {
			return res, err
		}
		policySum = sha256.Sum256(policyDoc)
	}
	if next.PolicyFile != running.PolicyFile || policySum != r.policySum {
		switch {
		case c.Global() != nil:
			res.Notes = append(res.Notes, "policy_file changed: with raft the active policy is the committed one; apply the file with `meridian policy apply` to change it")
		case sc != nil:
			setPolicy = true
			inForce.PolicyFile = next.PolicyFile
		default:
			// No cross-region component started: a policy file now would
			// turn them on, which takes a restart.
			res.RestartPending = append(res.RestartPending, "policy_file")
		}
	}
	if !slices.Equal(next.Pods.Static, running.Pods.Static) {
		static, setStatic = next.Pods.Static, true
		inForce.Pods.Static = next.Pods.Static
	}
	if !slices.Equal(next.Effective().Pods.AllowedEndpoints, running.Effective().Pods.AllowedEndpoints) {
		allowed = true
		inForce.Pods.AllowedEndpoints = next.Pods.AllowedEndpoints
	}
	if d := liveDecision(next.Decision, running.Decision); !reflect.DeepEqual(d, running.Decision) {
		decision, setDec = next.Decision, true
	}
	if c.auth != nil && reflect.DeepEqual(next.Auth, running.Auth) {
		if keys, err = c.auth.primary.Prepare(ctx); err != nil {
			return res, err
		}
	}
	if c.tls != nil && reflect.DeepEqual(next.TLS, running.TLS) {
		if tlsUp, err = c.tls.Prepare(); err != nil {
			return res, fmt.Errorf("tls: %w", err)
		}
	}

	// Keys that changed but cannot change live.
	live := inForce
	if setDec {
		live.Decision = liveDecision(next.Decision, running.Decision)
	}
	res.RestartPending = append(res.RestartPending, changedKeys(live, next)...)
	slices.Sort(res.RestartPending)
	res.RestartPending = slices.Compact(res.RestartPending)

	// Record what must be on record, then change everything.
	apply := func(ctx context.Context) error {
		if keys != nil {
			if err := keys.Install(ctx); err != nil {
				return err
			}
			res.Changed = append(res.Changed, keys.Change().Source)
		}
		if tlsUp != nil {
			tlsUp.Install()
			res.Changed = append(res.Changed, "tls")
		}
		if setPolicy {
			if err := sc.SetPolicy(newPolicy); err != nil {
				return err
			}
			r.policySum = policySum
			res.Changed = append(res.Changed, "policy")
		}
		if setDec {
			cfg, err := c.Decider.Reconfigure(decision)
			if err != nil {
				return err // Validate checked it: not reached
			}
			inForce.Decision = cfg
			res.Changed = append(res.Changed, "decision")
		}
		if allowed {
			c.gate.setAllowed(next.Pods)
			res.Changed = append(res.Changed, "pods.allowed_endpoints")
		}
		if setStatic {
			ch, err := c.Ingester.ApplyStatic(running.Pods.Static, static)
			if err != nil {
				c.log.Warn("static pods not all registered", "err", err)
			}
			c.log.Info("static pods reloaded", "added", ch.Added, "changed", ch.Changed, "removed", ch.Removed)
			res.Changed = append(res.Changed, "pods.static")
		}
		r.running = inForce
		return nil
	}
	if setPolicy {
		prev := "default"
		if running.PolicyFile != "" {
			prev = hex.EncodeToString(r.policySum[:])
		}
		act := c.selfAction(ActionPolicyReload, map[string]string{"file": next.PolicyFile, "sha256": hex.EncodeToString(policySum[:]),
			"previous_sha256": prev, "trigger": trigger})
		if newPolicy != nil {
			act.Args["policy_id"] = newPolicy.ID()
		}
		if err := c.admin().Run(ctx, act, apply); err != nil {
			return res, err
		}
		return res, nil
	}
	return res, apply(ctx)
}

// liveDecision is next with the settings a running Decider keeps
// (route.RestartKeys) as they are in running.
func liveDecision(next, running route.Config) route.Config {
	next.SessionTTL, next.MaxSessions, next.SpeculationTTL = running.SessionTTL, running.MaxSessions, running.SpeculationTTL
	return next
}

// changedKeys names the keys (dotted, two levels deep) whose values differ
// between two configurations.
func changedKeys(a, b Config) []string {
	var na, nb yaml.Node
	if na.Encode(a) != nil || nb.Encode(b) != nil {
		return []string{"(configuration)"}
	}
	var out []string
	var walk func(x, y *yaml.Node, prefix string, depth int)
	walk = func(x, y *yaml.Node, prefix string, depth int) {
		vals := func(n *yaml.Node) map[string]*yaml.Node {
			m := map[string]*yaml.Node{}
			for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
				m[n.Content[i].Value] = n.Content[i+1]
			}
			return m
		}
		mx, my := vals(x), vals(y)
		keys := map[string]bool{}
		for k := range mx {
			keys[k] = true
		}
		for k := range my {
			keys[k] = true
		}
		for k := range keys {
			vx, vy := mx[k], my[k]
			if vx != nil && vy != nil && nodeText(vx) == nodeText(vy) {
				continue
			}
			if depth > 1 && vx != nil && vy != nil && vx.Kind == yaml.MappingNode && vy.Kind == yaml.MappingNode {
				walk(vx, vy, prefix+k+".", depth-1)
				continue
			}
			out = append(out, prefix+k)
		}
	}
	walk(&na, &nb, "", 2)
	slices.Sort(out)
	return out
}

func nodeText(n *yaml.Node) string {
	b, err := yaml.Marshal(n)
	if err != nil {
		return ""
	}
	return string(b)
}

// control is the control plane of the controller (nil without one).
func (c *Controller) control() ControlPlane {
	if c.mr == nil {
		return nil
	}
	return c.mr.control
}

// admin is the recorder of the controller's own admin actions: its audit
// log (nothing is recorded without one).
func (c *Controller) admin() audit.Admin {
	if l := c.auditLog.Load(); l != nil {
		return audit.Admin{Log: l, Origin: c.cfg.Region}
	}
	return audit.Admin{}
}

// selfAction is an admin action the controller takes on its own.
func (c *Controller) selfAction(action string, args map[string]string) audit.AdminAction {
	act := audit.AdminAction{Action: action, Actor: "controller:" + c.cfg.ControllerID, Auth: audit.AuthInternal, Args: args}
	if cp := c.control(); cp != nil {
		act.PolicyVersion = cp.View().Version
	}
	return act
}

// guardKeys records a reloaded keys file or JWKS (api_keys_reload) before
// it takes effect, and refuses it when the record cannot be written (or
// when the audit log it belongs in is not open yet).
func (c *Controller) guardKeys(ctx context.Context, ch auth.Change, install func()) error {
	adm := c.admin()
	if !adm.Enabled() {
		if c.cfg.Audit.Dir != "" {
			return errors.New("the audit log is not open yet: the change is retried at the next check")
		}
		install() // a controller without an audit log records nothing
		return nil
	}
	act := c.selfAction(ActionAPIKeysReload, map[string]string{"source": ch.Source, "location": ch.Location,
		"sha256": ch.SHA256, "previous_sha256": ch.Previous, "keys": fmt.Sprint(ch.Keys)})
	return adm.Run(ctx, act, func(context.Context) error {
		install()
		return nil
	})
}

// watchedFiles are the files whose content the watch follows.
func (c *Controller) watchedFiles() []string {
	return watchedFiles(c.reload.running, c.deps.ConfigFile)
}

// watchedFiles are the files of cfg read from configFile whose content
// the watch follows.
func watchedFiles(cfg Config, configFile string) []string {
	files := []string{configFile, cfg.PolicyFile}
	if cfg.Auth.enabled() {
		files = append(files, cfg.Auth.APIKeys.File, cfg.Auth.JWT.JWKSFile)
	}
	if cfg.TLS != nil {
		files = append(files, cfg.TLS.Cert, cfg.TLS.Key, cfg.TLS.ClientCA)
	}
	return slices.DeleteFunc(files, func(f string) bool { return f == "" })
}

// maxWatchedBytes bounds each watched file read.
const maxWatchedBytes = 16 << 20

// fingerprint is the digest of each watched file's content ("missing" or
// the error for a file that cannot be read).
func fingerprint(files []string) map[string]string {
	out := make(map[string]string, len(files))
	for _, f := range files {
		out[f] = fileDigest(f)
	}
	return out
}

func fileDigest(name string) string {
	fh, err := os.Open(name)
	if err != nil {
		return "error: " + err.Error()
	}
	defer fh.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(fh, maxWatchedBytes)); err != nil {
		return "error: " + err.Error()
	}
	return hex.EncodeToString(h.Sum(nil))
}

// runWatch reloads the configuration when the content of a watched file
// changes. A change that does not load is reported once (the reload's
// error); the next change of content tries again.
func (c *Controller) runWatch(ctx context.Context, every time.Duration) error {
	c.reload.mu.Lock()
	last := c.reload.watched
	c.reload.mu.Unlock()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		c.reload.mu.Lock()
		files := c.watchedFiles()
		c.reload.mu.Unlock()
		now := fingerprint(files)
		var changed []string
		for _, f := range files {
			if now[f] != last[f] {
				changed = append(changed, f)
			}
		}
		if len(changed) == 0 {
			continue
		}
		c.log.Info("configuration files changed", "files", changed)
		last = now
		_, _ = c.Reload(ctx, "watch")
		// The reload may have moved the watch to other files (a new
		// policy_file): take them as they are now.
		c.reload.mu.Lock()
		for _, f := range c.watchedFiles() {
			if _, ok := last[f]; !ok {
				last[f] = fileDigest(f)
			}
		}
		c.reload.mu.Unlock()
	}
}

// loadPolicy reads and parses PolicyFile, returning its bytes too.
func (c Config) loadPolicy() (*residency.Policy, []byte, error) {
	b, err := os.ReadFile(c.PolicyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("config: policy_file: %w", err)
	}
	p, err := residency.Parse(c.PolicyFile, b)
	if err != nil {
		return nil, nil, fmt.Errorf("config: policy_file: %w", err)
	}
	return p, bytes.Clone(b), nil
}
