package auth

import (
	"context"
	"crypto/sha256"
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
	a := &Authenticator{cfg: cfg, log: deps.Logger, clock: deps.Clock, httpc: deps.HTTPClient, kick: make(chan struct{}, 1), done: make(chan struct{})}
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

// load reads and installs the mode's source. On the periodic path
// (explicit false) content that failed before is not reported again.
func (a *Authenticator) load(ctx context.Context, explicit bool) error {
	a.loadMu.Lock()
	defer a.loadMu.Unlock()
	a.lastRefresh.Store(a.clock.Now().UnixNano())
	source := "api_keys"
	var data []byte
	var err error
	if a.cfg.Mode == ModeJWT {
		source = "jwks"
		data, err = fetchJWKS(ctx, a.cfg.JWT, a.httpc)
	} else {
		data, err = readFileLimited(a.cfg.APIKeys.File, MaxKeysFileBytes)
		if err != nil {
			err = fmt.Errorf("api_keys.file: %w", err)
		}
	}
	sum := sha256.Sum256(data)
	first := a.keys.Load() == nil && a.jwks.Load() == nil
	if err == nil && !first && sum == a.loadedSum {
		return nil
	}
	if err == nil {
		if a.cfg.Mode == ModeJWT {
			var set *jose.JSONWebKeySet
			if set, err = parseJWKS(data, a.verifier.algs); err == nil {
				a.jwks.Store(set)
				a.m.keys.Set(float64(len(set.Keys)))
			}
		} else {
			var ks *KeySet
			if ks, err = ParseKeys(data); err == nil {
				a.keys.Store(ks)
				a.m.keys.Set(float64(ks.Len()))
			} else {
				err = fmt.Errorf("api_keys.file %s: %w", a.cfg.APIKeys.File, err)
			}
		}
	}
	if err != nil {
		if first {
			return err
		}
		if !explicit && sum == a.badSum {
			return err
		}
		a.badSum = sum
		a.m.reloads.WithLabelValues(source, "error").Inc()
		a.log.Error("credentials not reloaded; the previous set stays in use", "source", source, "err", err)
		return fmt.Errorf("reload %s: %w", source, err)
	}
	a.loadedSum, a.badSum = sum, [sha256.Size]byte{}
	if !first {
		a.m.reloads.WithLabelValues(source, "ok").Inc()
		a.log.Info("credentials reloaded", "source", source)
	}
	return nil
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
