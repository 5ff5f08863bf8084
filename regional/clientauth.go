package regional

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional/auth"
)

// ClientAuth establishes who a client is, with regional/auth, and holds
// each identity to its rate limit. The tenant and data class residency
// decides on are the identity's, never the client's claims: a client-sent
// X-Tenant-Id that differs from its identity is refused, X-Data-Class may
// only narrow within what the identity allows, and a request without one
// takes the identity's default.
type ClientAuth struct {
	primary  *auth.Authenticator
	gateways *auth.Authenticator // AuthConfig.Gateways, when set
	limiter  *auth.Limiter
}

// OpenClientAuth opens the authenticators of cfg (enabled). guard, if
// set, sees every reload of the keys file or JWKS before it takes effect
// (auth.Deps.Guard).
func OpenClientAuth(ctx context.Context, cfg AuthConfig, log *slog.Logger, r prometheus.Registerer,
	guard func(context.Context, auth.Change, func()) error) (*ClientAuth, error) {
	a := &ClientAuth{}
	var err error
	if a.primary, err = auth.Open(ctx, cfg.Config, auth.Deps{Logger: log, Registerer: r, Guard: guard}); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	if len(cfg.Gateways.Identities) > 0 || len(cfg.Gateways.CIDRs) > 0 {
		g := auth.DefaultConfig()
		g.Mode, g.TrustedHeaders = auth.ModeTrustedHeaders, cfg.Gateways
		// Its metrics are the primary's names: not registered twice.
		if a.gateways, err = auth.Open(ctx, g, auth.Deps{Logger: log}); err != nil {
			_ = a.primary.Close(ctx)
			return nil, fmt.Errorf("auth.gateways: %w", err)
		}
	}
	if a.limiter, err = auth.NewLimiter(auth.DefaultLimiterConfig()); err != nil {
		_ = a.Close(ctx)
		return nil, err
	}
	return a, nil
}

// Close stops the authenticators' reloads; safe twice.
func (a *ClientAuth) Close(ctx context.Context) error {
	var errs []error
	if a.primary != nil {
		errs = append(errs, a.primary.Close(ctx))
	}
	if a.gateways != nil {
		errs = append(errs, a.gateways.Close(ctx))
	}
	return errors.Join(errs...)
}

// Authenticate returns r's identity: a trusted gateway's headers first (if
// gateways are configured and r comes from one), else the primary mode.
func (a *ClientAuth) Authenticate(r *http.Request) (auth.Identity, error) {
	if a.gateways != nil {
		id, err := a.gateways.Authenticate(r)
		if err == nil || !errors.Is(err, auth.ErrMissingCredentials) {
			return id, err
		}
	}
	return a.primary.Authenticate(r)
}

// Allow reports whether id may make one more request now, and else when it
// may try again.
func (a *ClientAuth) Allow(id auth.Identity, now time.Time) (bool, time.Duration) {
	return a.limiter.Allow(id.Name, id.RateLimit, now)
}

// requestIdentity is who a request is for: the tenant and data class its
// residency is decided on, and the principal audit records name.
type requestIdentity struct {
	tenant, class string
	principal     string
}

// identify establishes the request's identity. A request forwarded by
// another controller (hop) carries the identity its origin established.
// When it returns false it has answered the client.
func (s *Server) identify(w http.ResponseWriter, r *http.Request, api string, hop bool) (requestIdentity, bool) {
	if hop || s.auth == nil {
		// Hops are authenticated by authHop; without client authentication
		// (an insecure controller) the headers are believed as they come.
		return requestIdentity{tenant: strings.ToLower(strings.TrimSpace(r.Header.Get(HeaderTenant))),
			class: strings.ToLower(strings.TrimSpace(r.Header.Get(HeaderDataClass))), principal: "headers"}, true
	}
	id, err := s.auth.Authenticate(r)
	if err != nil {
		var ae *auth.Error
		code := "unauthorized"
		if errors.As(err, &ae) {
			code = ae.Code
		}
		status := auth.Status(err)
		if status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="meridian"`)
		}
		s.m.authRefused.WithLabelValues(code).Inc()
		s.fail(w, api, status, code, "%v", err)
		return requestIdentity{}, false
	}
	if ok, wait := s.auth.Allow(id, s.now()); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(wait.Seconds())))))
		s.m.rateLimited.Inc()
		s.fail(w, api, http.StatusTooManyRequests, "rate_limited", "%s is over its rate limit; retry after %v", id.Name, wait.Round(time.Millisecond))
		return requestIdentity{}, false
	}
	return requestIdentity{tenant: id.Tenant, class: id.DataClass, principal: string(id.Method) + ":" + id.Name}, true
}

// authHop authenticates a request forwarded by another controller and
// returns its origin region. With TLS, the sender is who its certificate
// says: a controller identity that is a current member of the Raft
// configuration (when this controller has one), whose region is the origin
// the hop names; a shared token is not accepted. Without TLS (insecure),
// the hop token. When it returns false it has answered the client.
func (s *Server) authHop(w http.ResponseWriter, r *http.Request, api, origin string) bool {
	t := s.topo
	if t.HopByCertificate {
		id, ok := identity.FromRequest(r)
		switch {
		case !ok || !id.IsController():
			s.m.hopsRefused.WithLabelValues("no_controller_certificate").Inc()
			s.fail(w, api, http.StatusUnauthorized, "invalid_hop", "a forwarded request must come from a controller's certificate")
			return false
		case t.IsMember != nil && !t.IsMember(id.ControllerID):
			s.m.hopsRefused.WithLabelValues("not_a_member").Inc()
			s.fail(w, api, http.StatusForbidden, "invalid_hop", "controller %s is not a member of the cluster", id.ControllerID)
			return false
		case id.Region != origin:
			s.m.hopsRefused.WithLabelValues("region_mismatch").Inc()
			s.fail(w, api, http.StatusForbidden, "invalid_hop", "controller %s of region %s may not forward as region %s", id.ControllerID, id.Region, origin)
			return false
		}
		return true
	}
	if !hopTokenValid(t.HopToken, r.Header.Get(HeaderHopAuth)) {
		s.m.hopsRefused.WithLabelValues("bad_token").Inc()
		s.fail(w, api, http.StatusUnauthorized, "invalid_hop", "forwarded request without a valid %s", HeaderHopAuth)
		return false
	}
	return true
}

// maxSessionID is the longest session id kept as sent; longer ones are
// replaced by their SHA-256 (so a client cannot make the router keep or log
// megabytes per session).
const maxSessionID = 256

func capSessionID(id string) string {
	if len(id) <= maxSessionID {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(sum[:])
}
