package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/global/identity"
)

// Clock is the time source: token validity, reload intervals.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Deps are an Authenticator's collaborators; every field may be nil.
type Deps struct {
	// Logger: nil discards.
	Logger *slog.Logger
	// Clock: nil is the system clock.
	Clock Clock
	// Registerer receives the meridian_auth_* metrics; nil: not exported.
	Registerer prometheus.Registerer
	// HTTPClient fetches jwt.jwks_url; nil: a client with a 10s timeout.
	HTTPClient *http.Client
	// Guard, if set, is called before a reloaded keys file or JWKS replaces
	// the set in use (not for the first load): it must call install to put
	// the new set in use, or return an error to refuse it (the previous set
	// stays). A controller records the change in its audit log there,
	// before it takes effect.
	Guard func(ctx context.Context, ch Change, install func()) error
}

// Authenticator turns requests into identities. It is safe for concurrent
// use; Authenticate never blocks on I/O.
type Authenticator struct {
	cfg   Config
	log   *slog.Logger
	clock Clock
	m     *metrics
	httpc *http.Client

	keys     atomic.Pointer[KeySet]             // api_keys
	jwks     atomic.Pointer[jose.JSONWebKeySet] // jwt
	verifier *verifier
	trusted  map[string]bool // trusted_headers: identity URIs
	nets     []netip.Prefix

	guard       func(ctx context.Context, ch Change, install func()) error
	loadMu      sync.Mutex
	loadedSum   [sha256.Size]byte // of the source bytes in use
	badSum      [sha256.Size]byte // of the last refused bytes
	lastRefresh atomic.Int64      // unix ns of the last JWKS load attempt

	kick   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// Open loads the mode's source (keys file or JWKS; an error fails Open) and
// starts its reload loop. ctx bounds the first load only. Close stops it.
func Open(ctx context.Context, cfg Config, deps Deps) (*Authenticator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	a := &Authenticator{cfg: cfg, log: deps.Logger, clock: deps.Clock, httpc: deps.HTTPClient, guard: deps.Guard,
		kick: make(chan struct{}, 1), done: make(chan struct{})}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	a.log = a.log.With("component", "auth", "mode", string(cfg.Mode))
	if a.clock == nil {
		a.clock = systemClock{}
	}
	if a.httpc == nil {
		a.httpc = &http.Client{Timeout: 10 * time.Second}
	}
	var err error
	if a.m, err = newMetrics(deps.Registerer); err != nil {
		return nil, fmt.Errorf("open auth: %w", err)
	}
	switch cfg.Mode {
	case ModeJWT:
		a.verifier = &verifier{cfg: cfg.JWT}
		for _, s := range cfg.JWT.Algorithms {
			a.verifier.algs = append(a.verifier.algs, jose.SignatureAlgorithm(s))
		}
	case ModeTrustedHeaders:
		a.trusted = map[string]bool{}
		for _, s := range cfg.TrustedHeaders.Identities {
			a.trusted[s] = true
		}
		for _, s := range cfg.TrustedHeaders.CIDRs {
			p, _ := netip.ParsePrefix(s)
			a.nets = append(a.nets, p.Masked())
		}
	}
	if cfg.Mode != ModeTrustedHeaders {
		if err := a.load(ctx, true); err != nil {
			return nil, fmt.Errorf("open auth: %w", err)
		}
	}
	runCtx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go a.run(runCtx)
	return a, nil
}

// Close stops the reload loop; safe to call twice. Authenticate keeps
// working with the last loaded source.
func (a *Authenticator) Close(ctx context.Context) error {
	a.once.Do(a.cancel)
	select {
	case <-a.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close auth: %w", ctx.Err())
	}
}

func (a *Authenticator) run(ctx context.Context) {
	defer close(a.done)
	var every time.Duration
	switch a.cfg.Mode {
	case ModeAPIKeys:
		every = a.cfg.APIKeys.ReloadInterval
	case ModeJWT:
		every = a.cfg.JWT.RefreshInterval
	default:
		<-ctx.Done()
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.clock.After(every):
		case <-a.kick:
		}
		_ = a.load(ctx, false)
	}
}

// Reload reads the keys file or the JWKS again now. Unchanged content is a
// no-op; invalid content is refused (the previous set stays in use) and
// returned. In trusted_headers mode it does nothing.
func (a *Authenticator) Reload(ctx context.Context) error {
	if a.cfg.Mode == ModeTrustedHeaders {
		return nil
	}
	return a.load(ctx, true)
}

// Change describes a reload of the keys file or the JWKS, for the guard
// (Deps.Guard) and for logs: never key material.
type Change struct {
	// Source is "api_keys" or "jwks".
	Source string
	// Location is the keys file, the JWKS file or the JWKS URL.
	Location string
	// SHA256 is the digest of the new content, Previous of the content in
	// use (hex).
	SHA256, Previous string
	// Keys is how many keys the new set holds.
	Keys int
}

// Update is a keys file or JWKS read and checked by Prepare, not yet in
// use.
type Update struct {
	a      *Authenticator
	change Change
	keys   *KeySet
	jwks   *jose.JSONWebKeySet
	sum    [sha256.Size]byte
	base   [sha256.Size]byte // digest of the set in use when it was read
}

// Change describes the update.
func (u *Update) Change() Change { return u.change }

// Prepare reads the keys file or the JWKS and checks it as Reload would,
// without putting it in use: nil when it is unchanged (and in
// trusted_headers mode), an error (neither logged nor counted: the caller
// reports it) when it does not load. Update.Install puts the result in use.
// A configuration reload prepares every part first, so that one invalid
// part leaves all of them as they were.
func (a *Authenticator) Prepare(ctx context.Context) (*Update, error) {
	if a.cfg.Mode == ModeTrustedHeaders {
		return nil, nil
	}
	a.loadMu.Lock()
	defer a.loadMu.Unlock()
	u, err := a.prepareLocked(ctx)
	if err != nil {
		return nil, fmt.Errorf("reload %s: %w", u.change.Source, err)
	}
	if u.sum == a.loadedSum {
		return nil, nil
	}
	return u, nil
}

// prepareLocked reads and parses the mode's source. The update it returns
// carries the change's source and location even with an error.
func (a *Authenticator) prepareLocked(ctx context.Context) (*Update, error) {
	u := &Update{a: a, base: a.loadedSum}
	u.change.Previous = hexSum(a.loadedSum)
	var data []byte
	var err error
	if a.cfg.Mode == ModeJWT {
		u.change.Source, u.change.Location = "jwks", a.cfg.JWT.JWKSFile
		if u.change.Location == "" {
			u.change.Location = a.cfg.JWT.JWKSURL
		}
		data, err = fetchJWKS(ctx, a.cfg.JWT, a.httpc)
	} else {
		u.change.Source, u.change.Location = "api_keys", a.cfg.APIKeys.File
		data, err = readFileLimited(a.cfg.APIKeys.File, MaxKeysFileBytes)
		if err != nil {
			err = fmt.Errorf("api_keys.file: %w", err)
		}
	}
	u.sum = sha256.Sum256(data)
	u.change.SHA256 = hexSum(u.sum)
	if err != nil {
		return u, err
	}
	if a.cfg.Mode == ModeJWT {
		if u.jwks, err = parseJWKS(data, a.verifier.algs); err != nil {
			return u, err
		}
		u.change.Keys = len(u.jwks.Keys)
		return u, nil
	}
	if u.keys, err = ParseKeys(data); err != nil {
		return u, fmt.Errorf("api_keys.file %s: %w", a.cfg.APIKeys.File, err)
	}
	u.change.Keys = u.keys.Len()
	return u, nil
}

// Install puts the prepared set in use: through Deps.Guard when one is
// set (its error refuses the set: the previous one stays in use, and the
// error is returned), counted as meridian_auth_reloads_total{result="ok"}
// and logged. If the set in use changed since Prepare (the periodic reload
// got there first, with content read later), it does nothing.
func (u *Update) Install(ctx context.Context) error {
	a := u.a
	a.loadMu.Lock()
	defer a.loadMu.Unlock()
	if a.loadedSum != u.base {
		return nil
	}
	return a.installLocked(ctx, u)
}

// installLocked installs u through the guard.
func (a *Authenticator) installLocked(ctx context.Context, u *Update) error {
	put := func() {
		if u.jwks != nil {
			a.jwks.Store(u.jwks)
		} else {
			a.keys.Store(u.keys)
		}
		a.m.keys.Set(float64(u.change.Keys))
		a.loadedSum, a.badSum = u.sum, [sha256.Size]byte{}
	}
	if a.guard != nil {
		installed := false
		if err := a.guard(ctx, u.change, func() { put(); installed = true }); err != nil || !installed {
			if err == nil {
				err = errors.New("the guard did not install it")
			}
			a.m.reloads.WithLabelValues(u.change.Source, "error").Inc()
			a.log.Error("credentials not reloaded; the previous set stays in use", "source", u.change.Source, "err", err)
			return fmt.Errorf("reload %s: %w", u.change.Source, err)
		}
	} else {
		put()
	}
	a.m.reloads.WithLabelValues(u.change.Source, "ok").Inc()
	a.log.Info("credentials reloaded", "source", u.change.Source, "location", u.change.Location, "keys", u.change.Keys, "sha256", u.change.SHA256)
	return nil
}

func hexSum(s [sha256.Size]byte) string {
	if s == ([sha256.Size]byte{}) {
		return ""
	}
	return hex.EncodeToString(s[:])
}

// load reads and installs the mode's source. On the periodic path
// (explicit false) content that failed before is not reported again.
func (a *Authenticator) load(ctx context.Context, explicit bool) error {
	a.loadMu.Lock()
	defer a.loadMu.Unlock()
	a.lastRefresh.Store(a.clock.Now().UnixNano())
	first := a.keys.Load() == nil && a.jwks.Load() == nil
	u, err := a.prepareLocked(ctx)
	if err == nil && !first && u.sum == a.loadedSum {
		return nil
	}
	if err != nil {
		if first {
			return err
		}
		if !explicit && u.sum == a.badSum {
			return err
		}
		a.badSum = u.sum
		a.m.reloads.WithLabelValues(u.change.Source, "error").Inc()
		a.log.Error("credentials not reloaded; the previous set stays in use", "source", u.change.Source, "err", err)
		return fmt.Errorf("reload %s: %w", u.change.Source, err)
	}
	if first {
		if u.jwks != nil {
			a.jwks.Store(u.jwks)
		} else {
			a.keys.Store(u.keys)
		}
		a.m.keys.Set(float64(u.change.Keys))
		a.loadedSum = u.sum
		return nil
	}
	return a.installLocked(ctx, u)
}

// refreshSoon asks the loop for a JWKS refresh, at most once per
// MinRefreshInterval.
func (a *Authenticator) refreshSoon() {
	last, now := a.lastRefresh.Load(), a.clock.Now().UnixNano()
	if time.Duration(now-last) < a.cfg.JWT.MinRefreshInterval {
		return
	}
	// Claim the refresh: of concurrent requests with unknown kids, one
	// kicks the loop.
	if !a.lastRefresh.CompareAndSwap(last, now) {
		return
	}
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// Authenticate establishes the identity of r's caller, or returns an *Error
// (ErrMissingCredentials, ErrInvalidCredentials: 401; ErrTenantMismatch,
// ErrDataClassNotAllowed: 403).
func (a *Authenticator) Authenticate(r *http.Request) (Identity, error) {
	var id Identity
	var err error
	switch a.cfg.Mode {
	case ModeAPIKeys:
		id, err = a.apiKey(r)
	case ModeJWT:
		id, err = a.jwt(r)
	default:
		id, err = a.trustedHeaders(r)
	}
	a.m.observe(a.cfg.Mode, err)
	if err != nil {
		a.log.Debug("request not authenticated", "remote", r.RemoteAddr, "err", err)
		return Identity{}, err
	}
	return id, nil
}

// bearer returns the credential of r: the Authorization bearer token, or
// (with allowKeyHeader) X-Api-Key.
func bearer(r *http.Request, allowKeyHeader bool) (string, error) {
	var tok string
	if h := r.Header.Values("Authorization"); len(h) > 0 {
		if len(h) > 1 {
			return "", refuse(ErrInvalidCredentials, "several Authorization headers")
		}
		scheme, rest, _ := strings.Cut(strings.TrimSpace(h[0]), " ")
		if !strings.EqualFold(scheme, "Bearer") {
			return "", refuse(ErrInvalidCredentials, "Authorization scheme %q: want Bearer", clip(scheme))
		}
		tok = strings.TrimSpace(rest)
		if tok == "" {
			return "", refuse(ErrMissingCredentials, "empty bearer token")
		}
	}
	if allowKeyHeader {
		if k := r.Header.Values(HeaderAPIKey); len(k) > 0 {
			v := strings.TrimSpace(k[0])
			if len(k) > 1 || (tok != "" && v != tok) {
				return "", refuse(ErrInvalidCredentials, "different keys in Authorization and %s", HeaderAPIKey)
			}
			tok = v
		}
	}
	if tok == "" {
		if allowKeyHeader {
			return "", refuse(ErrMissingCredentials, "send the API key as Authorization: Bearer <key>")
		}
		return "", refuse(ErrMissingCredentials, "send the token as Authorization: Bearer <token>")
	}
	return tok, nil
}

func (a *Authenticator) apiKey(r *http.Request) (Identity, error) {
	key, err := bearer(r, true)
	if err != nil {
		return Identity{}, err
	}
	if len(key) < MinKeyBytes || len(key) > maxKeyBytes {
		return Identity{}, refuse(ErrInvalidCredentials, "API keys are %d..%d bytes (meridian auth keygen)", MinKeyBytes, maxKeyBytes)
	}
	e, ok := a.keys.Load().lookup(sha256.Sum256([]byte(key)))
	if !ok {
		return Identity{}, refuse(ErrInvalidCredentials, "unknown API key")
	}
	id := Identity{Name: e.Name, Tenant: e.Tenant, DataClasses: e.DataClasses, DefaultDataClass: e.DefaultDataClass,
		RateLimit: a.cfg.DefaultRateLimit, Method: MethodAPIKey}
	if e.RateLimit != nil {
		id.RateLimit = *e.RateLimit
	}
	if err := applyHeaders(&id, r.Header); err != nil {
		return Identity{}, err
	}
	return id, nil
}

func (a *Authenticator) jwt(r *http.Request) (Identity, error) {
	tok, err := bearer(r, false)
	if err != nil {
		return Identity{}, err
	}
	id, err := a.verifier.verify(tok, a.jwks.Load(), a.clock.Now())
	if err != nil {
		if errors.Is(err, errUnknownKID) {
			a.refreshSoon()
		}
		var e *Error
		if errors.As(err, &e) {
			return Identity{}, e
		}
		return Identity{}, refuse(ErrInvalidCredentials, "%v", err)
	}
	id.RateLimit = a.cfg.DefaultRateLimit
	if err := applyHeaders(&id, r.Header); err != nil {
		return Identity{}, err
	}
	return id, nil
}

func (a *Authenticator) trustedHeaders(r *http.Request) (Identity, error) {
	name, ok := a.trustedPeer(r)
	if !ok {
		return Identity{}, refuse(ErrMissingCredentials, "only trusted gateways may send %s", HeaderTenant)
	}
	id := Identity{Name: name, RateLimit: a.cfg.TrustedHeaders.RateLimit, Method: MethodTrustedHeaders}
	raw, ok := headerValue(r.Header, HeaderTenant)
	if !ok {
		return Identity{}, refuse(ErrInvalidCredentials, "several different %s values", HeaderTenant)
	}
	if raw == "" {
		return Identity{}, refuse(ErrMissingCredentials, "the gateway sent no %s", HeaderTenant)
	}
	if id.Tenant, ok = normValue(raw); !ok {
		return Identity{}, refuse(ErrInvalidCredentials, "%s %q is not a tenant", HeaderTenant, clip(raw))
	}
	raw, ok = headerValue(r.Header, HeaderDataClass)
	if !ok {
		return Identity{}, refuse(ErrDataClassNotAllowed, "several different %s values", HeaderDataClass)
	}
	if raw != "" {
		if id.DataClass, ok = normValue(raw); !ok {
			return Identity{}, refuse(ErrDataClassNotAllowed, "%s %q is not a data class", HeaderDataClass, clip(raw))
		}
	}
	return id, nil
}

// trustedPeer names r's peer if it is a trusted gateway: by its verified
// mTLS identity, else by its TCP address.
func (a *Authenticator) trustedPeer(r *http.Request) (string, bool) {
	if pid, ok := identity.FromRequest(r); ok && a.trusted[pid.String()] {
		return pid.String(), true
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return "", false
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return "", false
	}
	addr = addr.Unmap()
	for _, p := range a.nets {
		if p.Contains(addr) {
			return "addr:" + addr.String(), true
		}
	}
	return "", false
}

func readFileLimited(name string, limit int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, limit)
	}
	return b, nil
}

type metrics struct {
	all     *prometheus.CounterVec
	reloads *prometheus.CounterVec
	keys    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		all: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_auth_requests_total",
			Help: "Requests authenticated, by mode and result (ok, missing_credentials, invalid_credentials, tenant_mismatch, data_class_not_allowed).",
		}, []string{"mode", "result"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_auth_reloads_total",
			Help: "Reloads of the API keys file or the JWKS after the first load, by source and result (ok, error: the previous set stays in use).",
		}, []string{"source", "result"}),
		keys: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meridian_auth_keys",
			Help: "API keys (api_keys mode) or verification keys (jwt mode) in use.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.all, m.reloads, m.keys} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register auth metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) observe(mode Mode, err error) {
	code := "ok"
	if err != nil {
		code = "internal"
		var e *Error
		if errors.As(err, &e) {
			code = e.Code
		}
	}
	m.all.WithLabelValues(string(mode), code).Inc()
}
