package regional

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/residency"
)

// Request headers of the cross-region path.
const (
	HeaderTenant     = "X-Tenant-Id"
	HeaderDataClass  = "X-Data-Class"
	HeaderSession    = "X-Session-Id"
	HeaderRequestID  = "X-Request-Id"
	HeaderHop        = "X-Meridian-Hop"      // origin region of a forwarded request
	HeaderHopAuth    = "X-Meridian-Hop-Auth" // the controllers' shared forwarding token
	HeaderDecisionID = "X-Meridian-Decision-Id"
	// HeaderController, on an answer, names the controller whose pod
	// served it (one of the region's replicas).
	HeaderController = "X-Meridian-Controller"
)

// RemoteSource is what the request path knows of the other regions (from
// gossip): cost-model candidates for the regions a filter allows, and where
// to forward to each.
type RemoteSource interface {
	// Candidates are the regions that serve model and that allowed accepts,
	// priced by the cost model cost (gossip.RegionsView.Candidates).
	Candidates(now time.Time, model string, chain []uint64, promptTokens int, allowed func(region string) bool, cost *gorgo.Model, dst []gorgo.Candidate) []gorgo.Candidate
	ForwardAddrs(region string) []string
	// Serves reports whether any other region says it serves model, and
	// whether anything is known of the other regions' models at all.
	Serves(model string) (serves, known bool)
}

// unseenSource is a RemoteSource that can also say when each region's
// summary arrived, the RTT to it and its pod count, for
// route.Forwarded.Adjust.
type unseenSource interface {
	Unseen(region string) (route.Unseen, bool)
}

// Auditor records cross-region decisions and residency denials. Append
// returns only once the record is durable; an error means it is not.
type Auditor interface {
	Append(ctx context.Context, e audit.Entry) error
}

// Topology connects a Server to the other regions. The zero Topology is a
// single-region controller: no residency evaluation (nothing can leave the
// region), no forwarding.
type Topology struct {
	// Region is this controller's region.
	Region string
	// Control gives the residency policy and region states; nil: no
	// residency evaluation (single region).
	Control ControlPlane
	// Remotes are the other regions; nil: none.
	Remotes RemoteSource
	// Audit records decisions; without it no request is sent to another
	// region (a crossing must be recorded first).
	Audit Auditor
	// HopByCertificate: forwarding between controllers is authenticated by
	// the sending controller's TLS certificate (see authHop), and requests
	// are forwarded over mutual TLS. Otherwise (an insecure controller)
	// HopToken authenticates it; with neither, forwarded requests are
	// refused and none are sent.
	HopByCertificate bool
	// IsMember reports whether a controller id is a member of the Raft
	// configuration (a hop's sender must be); nil: any controller
	// certificate of the cluster's CA.
	IsMember func(controllerID string) bool
	// HopToken authenticates forwarding without TLS (insecure only).
	HopToken string
	// Shares is the state of the remote-share guardrail.
	Shares *gorgo.ShareTracker
	// Replicas lists the other live controllers of this region (their
	// ids, as their replica reports name them); nil: none known.
	Replicas func() []string
}

// SetTopology connects the server to the other regions; call it before
// serving.
func (s *Server) SetTopology(t Topology) {
	if t.Shares == nil {
		t.Shares = gorgo.NewShareTracker(s.dec.Model().Config().ShareWindow)
	}
	s.topo = t
	if t.Control != nil {
		s.m.knowPolicy(t.Control.View().Policy, t.Region)
	}
}

// denial is a residency refusal with its explanation.
type denial struct {
	status  int
	code    string
	message string
	rule    string
	version string
}

// placed is a request after residency and placement.
type placed struct {
	// pl is nil when the request is served here without a choice: a
	// single-region controller, or a request forwarded in.
	pl         *route.Placement
	entry      audit.Entry // filled for the audit records of this request
	decisionID string
}

// routeAndServe applies residency and region state, places the request
// (this region or another) and serves it.
func (s *Server) routeAndServe(w http.ResponseWriter, r *http.Request, p *parsed, api string) {
	pr, ok := s.placeRequest(w, r, p, api, false)
	if ok && pr.pl != nil {
		pr.pl.Record(s.topo.Shares, s.now())
	}
	switch {
	case !ok:
	case pr.pl == nil:
		// Single region, or forwarded in: served here or nowhere.
		if lr := s.serveLocal(w, r, p, api, nil); !lr.answered {
			s.localFailed(w, api, lr)
		}
	default:
		s.servePlaced(w, r, p, api, pr.pl, pr.entry)
	}
}

// placeRequest evaluates residency (with the hop's origin for a request
// forwarded in, which is then served here or nowhere), checks region states
// and places the request. When it returns false it has answered the client.
// A dry run (POST /v1/route) explains and records nothing.
func (s *Server) placeRequest(w http.ResponseWriter, r *http.Request, p *parsed, api string, dry bool) (placed, bool) {
	t := s.topo
	hop := r.Header.Get(HeaderHop)
	if t.Control == nil {
		if hop != "" {
			s.fail(w, api, http.StatusUnauthorized, "invalid_hop", "this controller does not accept forwarded requests")
			return placed{}, false
		}
		if _, ok := s.identify(w, r, api, false); !ok {
			return placed{}, false
		}
		if !dry {
			// Nothing records or returns it (no audit, no header): only
			// the dry run's answer names it.
			return placed{}, true
		}
		return placed{decisionID: newDecisionID()}, true
	}
	origin := t.Region
	if hop != "" {
		if !s.authHop(w, r, api, hop) {
			return placed{}, false
		}
		origin = hop
	}
	who, ok := s.identify(w, r, api, hop != "")
	if !ok {
		return placed{}, false
	}
	p.tenant, p.class = who.tenant, who.class
	decisionID := r.Header.Get(HeaderDecisionID)
	if hop == "" || decisionID == "" {
		decisionID = newDecisionID()
	}
	w.Header().Set(HeaderDecisionID, decisionID)

	ctl := t.Control.View()
	pol, version, err := ctl.Policy, ctl.Version, ctl.Err
	if err != nil {
		s.fail(w, api, http.StatusServiceUnavailable, "residency_policy_unavailable", "no usable residency policy, so nothing is served: %v", err)
		return placed{}, false
	}
	attrs := residency.Attributes{Tenant: who.tenant, DataClass: who.class,
		OriginRegion: origin, Session: p.req.SessionID, Model: p.body.Model}
	var rd residency.Decision
	if attrs.DataClass == "" {
		// No data class, and no default for the identity: the policy's
		// strictest treatment (its origin zone only), not a refusal naming
		// whichever rule needed a data class.
		rd = pol.EvaluateUnclassified(attrs)
		attrs.DataClass = residency.Unclassified
	} else {
		rd = pol.Evaluate(attrs)
	}
	entry := audit.Entry{DecisionID: decisionID, RequestID: p.req.RequestID, Tenant: attrs.Tenant, Session: attrs.Session,
		Origin: origin, DataClass: attrs.DataClass, Rule: ruleName(rd), PolicyVersion: version}
	pr := placed{entry: entry, decisionID: decisionID}

	if rd.Allowed.Empty() || (hop != "" && !rd.Allows(t.Region)) {
		s.deny(w, r, api, dry, entry, denial{status: http.StatusUnavailableForLegalReasons, code: "residency_denied",
			message: "residency policy forbids serving this request here: " + rd.Reason(), rule: entry.Rule, version: version})
		return pr, false
	}
	if hop != "" {
		// Forwarded in: served here or nowhere (a request crosses at most
		// once). A recovering region takes what the origin could place
		// nowhere else (see below).
		if !ctl.Routable(t.Region) && !ctl.LastResort(t.Region) {
			s.fail(w, api, http.StatusServiceUnavailable, "region_unavailable", "region %s is %s", t.Region, ctl.RegionState(t.Region))
			return pr, false
		}
		if !dry {
			// Both ends of a crossing are on record, or it is not served:
			// the origin then tries the next allowed region.
			in := entry
			in.Kind, in.Region = audit.KindForwardedIn, t.Region
			if !s.mustRecord(r.Context(), in) {
				s.fail(w, api, http.StatusServiceUnavailable, "audit_unavailable",
					"the forwarded request could not be recorded here, so it is not served here")
				return pr, false
			}
			s.m.forwardedIn.WithLabelValues(origin).Inc()
		}
		return pr, true
	}

	localOK := rd.Allows(t.Region) && ctl.Routable(t.Region)
	canForward := t.Remotes != nil && t.Audit != nil && (t.HopByCertificate || t.HopToken != "")
	var remotes []gorgo.Candidate
	if canForward {
		remotes = t.Remotes.Candidates(s.now(), p.req.Model, p.req.Chain, p.req.PromptTokens, func(region string) bool {
			return region != t.Region && rd.Allows(region) && ctl.Routable(region)
		}, s.dec.Model(), nil)
		if u, ok := t.Remotes.(unseenSource); ok {
			s.fwd.Adjust(remotes, u.Unseen)
		}
		now := s.now()
		s.trend.Note(now, s.dec.BacklogMs(now))
		s.trend.Adjust(remotes, now, s.dec.Model())
	}
	if !localOK && len(remotes) == 0 {
		// No routable region may serve it. The hold-down of a recovering
		// region keeps away traffic that has a choice, not traffic that
		// may only be served there: refusing that would turn a healed
		// partition into an outage.
		localOK = rd.Allows(t.Region) && ctl.LastResort(t.Region)
		if canForward {
			remotes = t.Remotes.Candidates(s.now(), p.req.Model, p.req.Chain, p.req.PromptTokens, func(region string) bool {
				return region != t.Region && rd.Allows(region) && ctl.LastResort(region)
			}, s.dec.Model(), nil)
		}
	}
	pl, err := s.dec.Place(&p.req, t.Region, localOK, remotes, t.Shares)
	if err != nil {
		if s.refuseNotReady(w, api, err) {
			return pr, false
		}
		if !localOK || errors.Is(err, route.ErrNoRegion) {
			s.m.residencyNoRegion.Inc()
			s.fail(w, api, http.StatusServiceUnavailable, "residency_no_healthy_region",
				"no region the residency policy allows (%s) can serve the request: %v", strings.Join(rd.Regions(), ", "), err)
			return pr, false
		}
		s.decisionError(w, api, err)
		return pr, false
	}
	pr.pl = pl
	return pr, true
}

// servePlaced serves a placed request: on the chosen place, then, while a
// place fails before anything reached the client, on the next allowed one
// by estimated TTFT (this region's pods, or another allowed region).
// Every crossing is recorded before it happens, the first as a cross-region
// decision, later ones as fallbacks; if a record cannot be written the
// request does not cross at all.
func (s *Server) servePlaced(w http.ResponseWriter, r *http.Request, p *parsed, api string, pl *route.Placement, entry audit.Entry) {
	kind := audit.KindCrossRegion
	if !pl.Remote {
		kind = audit.KindFallback // the local winner failed: spilling over
	}
	var local *localResult
	var lastRemote error
	serveHere := func(i, ci int) bool {
		if i > 0 {
			e := entry
			e.Kind, e.Region, e.Cost = audit.KindFallback, s.topo.Region, costJSON(pl, ci)
			s.record(r.Context(), e)
			s.m.fallbacks.Inc()
		}
		lr := s.serveLocal(w, r, p, api, pl.Local)
		local = &lr
		return lr.answered
	}
	for i, ci := range fallbackOrder(pl) {
		c := pl.Candidates[ci]
		if !c.Remote {
			if serveHere(i, ci) {
				return
			}
			continue
		}
		e := entry
		e.Kind, e.Region, e.Cost = kind, c.Region, costJSON(pl, ci)
		if !s.mustRecord(r.Context(), e) {
			s.log.Warn("not crossing the region boundary: the decision is not on record", "to", c.Region)
			if pl.Local != nil && local == nil && serveHere(i, ci) {
				return
			}
			if local == nil || local.attempts == 0 {
				s.fail(w, api, http.StatusServiceUnavailable, "audit_unavailable",
					"the cross-region decision could not be recorded, so the request was not forwarded")
				return
			}
			break
		}
		left := s.cfg.Forward.Budget - s.now().Sub(p.started)
		if left <= 0 {
			lastRemote = fmt.Errorf("region %s not tried: the request's %v budget is spent", c.Region, s.cfg.Forward.Budget)
			break
		}
		lim := s.cfg.Forward.limits(c.RTTMs, pl.Cost.Estimates[ci].TotalMs, s.cfg.FirstByteTimeout, left)
		s.m.crossRegion.WithLabelValues(c.Region).Inc()
		id := s.fwd.Add(c.Region, s.now(), pl.Cost.Estimates[ci].Uncached)
		landed := func() { s.fwd.Landed(c.Region, id) }
		res := s.forwardRemote(r.Context(), w, r, p, c.Region, entry.Origin, entry.DecisionID, lim, landed)
		landed()
		if res.err == nil || res.wrote || !res.retryable || r.Context().Err() != nil {
			switch {
			case res.wrote && res.err != nil:
				s.m.requests.WithLabelValues(api, "truncated").Inc()
				p.abort = true
			case res.err != nil && !errors.Is(res.err, context.Canceled):
				s.fail(w, api, http.StatusBadGateway, "upstream_failed", "region %s: %v", c.Region, res.err)
			case res.err != nil:
				s.m.requests.WithLabelValues(api, "499").Inc()
			default:
				s.m.request(api, res.status).Inc()
			}
			return
		}
		s.log.Warn("region failed before answering; trying the next allowed one", "remote_region", c.Region, "err", res.err)
		lastRemote = fmt.Errorf("region %s: %w", c.Region, res.err)
		kind = audit.KindFallback
	}
	switch {
	case lastRemote != nil:
		s.fail(w, api, http.StatusBadGateway, "upstream_failed", "every allowed region tried failed before answering (last: %v)", lastRemote)
	case local != nil:
		s.localFailed(w, api, *local)
	default:
		s.fail(w, api, http.StatusBadGateway, "upstream_failed", "every allowed region tried failed before answering")
	}
}

// fallbackOrder is the winner first, then the others by estimated TTFT,
// those with a stale summary or suspect controllers after the rest.
func fallbackOrder(pl *route.Placement) []int {
	order := []int{pl.Cost.Winner}
	rest := make([]int, 0, len(pl.Candidates))
	for i := range pl.Candidates {
		if i != pl.Cost.Winner {
			rest = append(rest, i)
		}
	}
	unconfirmed := func(i int) bool {
		ex := pl.Cost.Estimates[i].Excluded
		return ex == gorgo.ExcludedStale || ex == gorgo.ExcludedSuspect
	}
	slices.SortStableFunc(rest, func(a, b int) int {
		if ua, ub := unconfirmed(a), unconfirmed(b); ua != ub {
			if ua {
				return 1
			}
			return -1
		}
		return cmp.Compare(pl.Cost.Estimates[a].TotalMs, pl.Cost.Estimates[b].TotalMs)
	})
	return append(order, rest...)
}

// forwardRemote relays the request to a controller of region (one hop,
// marked so it is not forwarded again), trying its live controllers in turn
// before the first byte, each within lim (ForwardConfig) and the request's
// budget; firstByte runs when the first byte of the answer arrives.
func (s *Server) forwardRemote(ctx context.Context, w http.ResponseWriter, r *http.Request, p *parsed, region, origin, decisionID string, lim limits, firstByte func()) attempt {
	addrs := s.links.order(s.topo.Remotes.ForwardAddrs(region))
	if len(addrs) == 0 {
		return attempt{retryable: true, kind: "connect", err: fmt.Errorf("region %s has no live controller with a forward address", region)}
	}
	// The identity this controller established travels with the hop (the
	// client's own credential does not: the other region trusts this
	// controller's certificate, not the client).
	add := http.Header{HeaderHop: {origin}, HeaderDecisionID: {decisionID}, HeaderTenant: {p.tenant}, HeaderDataClass: {p.class}}
	if !s.topo.HopByCertificate {
		add[HeaderHopAuth] = []string{s.topo.HopToken}
	}
	out := []headerField{{"X-Meridian-Forwarded-To", []string{region}}}
	var res attempt
	var tried []string // what each failed controller came to, for the answer
	for i, addr := range addrs {
		left := s.cfg.Forward.Budget - s.now().Sub(p.started)
		if i > 0 && left <= 0 {
			break
		}
		try := lim
		try.firstByte, try.within = min(lim.firstByte, left), left
		if rest := len(addrs) - i; rest > 1 {
			// A controller that does not connect leaves the others
			// their share of what is left.
			try.connect = min(lim.connect, left/time.Duration(rest))
		}
		try.connect = min(try.connect, try.firstByte)
		res = s.relay(ctx, s.peerClient, w, r, p, strings.TrimRight(addr, "/")+r.URL.Path, add, out, "region "+region, try, func(int) { firstByte() })
		switch {
		case res.wrote || (res.status != 0 && res.status < 500):
			s.links.note(addr, true) // it answered
		case res.status >= 500 || res.kind == "connect" || res.kind == "connect_timeout" || res.kind == "refused":
			// It could not serve, or could not be reached: its replicas
			// go first until it answers again (a forward or a probe).
			s.links.note(addr, false)
		}
		if res.err == nil || res.wrote || !res.retryable || ctx.Err() != nil {
			return res
		}
		s.m.upstreamErrors.WithLabelValues(res.kind).Inc()
		tried = append(tried, fmt.Sprintf("%s: %v", addr, res.err))
	}
	if len(tried) > 1 {
		// The last failure alone would hide why the ones before it
		// failed (a dead controller tried last hides the live one's).
		res.err = fmt.Errorf("%w (%d controllers tried: %s)", res.err, len(tried), strings.Join(tried, "; "))
	}
	return res
}

// deny answers a residency refusal and records it, unless dry. Every 451
// has its record: a denial that cannot be recorded is answered 503
// audit_unavailable instead (nothing is served either way; the client may
// ask again once the audit log is writable), so the log never misses a
// denial that was given.
func (s *Server) deny(w http.ResponseWriter, r *http.Request, api string, dry bool, e audit.Entry, d denial) {
	e.Kind = audit.KindResidencyDenied
	if e.Rule == "" {
		e.Rule = "(none)"
	}
	if !dry {
		if !s.mustRecord(r.Context(), e) {
			s.fail(w, api, http.StatusServiceUnavailable, "audit_unavailable",
				"the request is not served; its residency decision could not be recorded")
			return
		}
		s.m.residencyDenials.WithLabelValues(e.Rule).Inc()
	}
	s.m.request(api, d.status).Inc()
	var body apiError
	body.Error.Message, body.Error.Code, body.Error.Type = d.message, d.code, "residency_error"
	body.Error.Rule, body.Error.PolicyVersion = d.rule, d.version
	writeJSON(w, d.status, body)
}

// record appends a best-effort record (a fallback to this region, whose
// crossing was recorded before it was attempted).
func (s *Server) record(ctx context.Context, e audit.Entry) {
	s.mustRecord(ctx, e)
}

// mustRecord appends a record and reports whether it is durable. A failure
// is counted and logged with its cause (which may name files: it never
// goes into an answer to a client).
func (s *Server) mustRecord(ctx context.Context, e audit.Entry) bool {
	if s.topo.Audit == nil {
		return true
	}
	if err := s.topo.Audit.Append(ctx, e); err != nil {
		s.m.auditFailures.Inc()
		s.auditHealth.failed(s.now(), err)
		s.log.Error("audit record could not be written", "kind", e.Kind, "decision", e.DecisionID, "err", err)
		return false
	}
	s.auditHealth.ok(s.now())
	return true
}

func ruleName(d residency.Decision) string {
	if d.DeniedBy.Valid() && d.Allowed.Empty() {
		return d.DeniedBy.Name
	}
	if d.Rule.Valid() {
		return d.Rule.Name
	}
	if d.Outcome == residency.OutcomeDefault {
		return "default"
	}
	return ""
}

// CostExplanation is what an audit record (and a /v1/route answer) keeps
// of a placement, as JSON: the cost terms of every candidate region.
type CostExplanation struct {
	Chosen     string          `json:"chosen"`
	Reason     string          `json:"reason"`
	MarginMs   float64         `json:"margin_ms"`
	RequiredMs float64         `json:"required_ms"`
	Candidates []CandidateCost `json:"candidates"`
}

// CandidateCost is one candidate region's terms in a CostExplanation.
type CandidateCost struct {
	Region       string         `json:"region"`
	Pod          string         `json:"pod,omitempty"`
	Remote       bool           `json:"remote"`
	PromptTokens int            `json:"prompt_tokens"`
	CachedTokens int            `json:"cached_tokens"`
	RTTMs        float64        `json:"rtt_ms"`
	SummaryAgeMs int64          `json:"summary_age_ms,omitempty"`
	Estimate     gorgo.Estimate `json:"estimate"`
}

func costJSON(pl *route.Placement, chosen int) json.RawMessage {
	ex := CostExplanation{Chosen: pl.Candidates[chosen].Region, Reason: pl.Reason, MarginMs: pl.Cost.MarginMs, RequiredMs: pl.Cost.RequiredMs}
	for i, c := range pl.Candidates {
		ex.Candidates = append(ex.Candidates, CandidateCost{Region: c.Region, Pod: c.Pod, Remote: c.Remote,
			PromptTokens: c.PromptTokens, CachedTokens: c.CachedTokens, RTTMs: c.RTTMs,
			SummaryAgeMs: c.SummaryAge.Milliseconds(), Estimate: pl.Cost.Estimates[i]})
	}
	b, err := json.Marshal(ex)
	if err != nil {
		return json.RawMessage(`{}`)
	}
	return b
}

// hopTokenValid compares a hop token in constant time (of SHA-256
// digests, so the comparison does not leak the token's length).
func hopTokenValid(want, got string) bool {
	if want == "" {
		return false
	}
	w, g := sha256.Sum256([]byte(want)), sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(w[:], g[:]) == 1
}
