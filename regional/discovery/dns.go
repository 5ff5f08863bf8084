package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// targetLookups bounds the host names of an SRV answer resolved at once.
const targetLookups = 8

// DNS is the source that follows a Kubernetes headless Service: see
// DNSConfig and the package doc.
type DNS struct {
	*runner
	cfg DNSConfig
}

// NewDNS builds a DNS source (cfg is validated, zero fields defaulted).
func NewDNS(cfg DNSConfig, deps Deps) (*DNS, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r, err := newRunner("dns", cfg.Name, deps, newTracker(cfg.Grace, cfg.DropAfterMisses))
	if err != nil {
		return nil, err
	}
	d := &DNS{runner: r, cfg: cfg}
	r.lookup = func(ctx context.Context, _ bool) (answer, error) { return d.lookup(ctx) }
	r.delay = d.delay
	return d, nil
}

// Run implements Source.
func (d *DNS) Run(ctx context.Context, update func(pods []Pod)) error { return d.run(ctx, update) }

// Refresh implements Source.
func (d *DNS) Refresh(ctx context.Context) error { return d.requestRefresh(ctx) }

// delay is the wait before the next lookup: the answer's shortest TTL
// within [MinInterval, Interval], Interval when no TTL was seen, and after
// failures MinInterval doubled per failure up to Interval.
func (d *DNS) delay(a answer, err error, fails int) time.Duration {
	lo, hi := d.cfg.MinInterval, d.cfg.Interval
	if err != nil {
		wait := lo
		for i := 1; i < fails && wait < hi; i++ {
			wait *= 2
		}
		return min(wait, hi)
	}
	if !a.ttlSeen {
		return hi
	}
	return min(max(a.ttl, lo), hi)
}

// resolver returns a resolver that asks the configured server (or the
// system's) and shows every response to o.
func (d *DNS) resolver(o *ttlObserver) *net.Resolver {
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			if d.cfg.Server != "" {
				address = d.cfg.Server
			}
			var dialer net.Dialer
			c, err := dialer.DialContext(ctx, network, address)
			if err != nil {
				return nil, err
			}
			return o.wrap(c), nil
		},
	}
}

// endpoint is one pod as a record gave it.
type endpoint struct {
	target string // the SRV target; "" with lookup ip
	addr   netip.Addr
	port   uint16
}

// lookup asks DNS once for the Service's pods.
func (d *DNS) lookup(ctx context.Context) (answer, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	o := &ttlObserver{}
	res := d.resolver(o)
	var eps []endpoint
	var err error
	if d.cfg.Lookup == LookupSRV {
		eps, err = d.lookupSRV(ctx, res)
	} else {
		eps, err = d.lookupIP(ctx, res)
	}
	if err != nil {
		return answer{}, err
	}
	ttl, seen := o.min()
	pods := make([]Pod, 0, len(eps))
	for _, ep := range eps {
		pods = append(pods, d.cfg.pod(ep))
	}
	pods = dedupe(pods, func(a, b Pod) int { return cmp.Compare(a.Endpoint, b.Endpoint) })
	return answer{pods: pods, ttl: ttl, ttlSeen: seen, notFound: len(pods) == 0}, nil
}

// lookupIP reads the A/AAAA records of the name.
func (d *DNS) lookupIP(ctx context.Context, res *net.Resolver) ([]endpoint, error) {
	addrs, err := res.LookupNetIP(ctx, d.cfg.Network, d.cfg.Name)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("look up %s %s: %w", d.cfg.Network, d.cfg.Name, err)
	}
	eps := make([]endpoint, 0, len(addrs))
	for _, a := range addrs {
		eps = append(eps, endpoint{addr: a.Unmap().WithZone(""), port: uint16(d.cfg.Port)})
	}
	return eps, nil
}

// lookupSRV reads the SRV records and resolves the host names they name.
// A name that no longer resolves is skipped (its pod went away between the
// two answers); any other failure fails the lookup.
func (d *DNS) lookupSRV(ctx context.Context, res *net.Resolver) ([]endpoint, error) {
	_, srvs, err := res.LookupSRV(ctx, d.cfg.Service, d.cfg.Proto, d.cfg.Name)
	query := "_" + d.cfg.Service + "._" + d.cfg.Proto + "." + d.cfg.Name
	switch {
	case err != nil && isNotFound(err):
		return nil, nil
	case err != nil && len(srvs) == 0:
		return nil, fmt.Errorf("look up srv %s: %w", query, err)
	case err != nil:
		// The resolver drops records whose target is not a valid name and
		// says so; the others are good.
		d.log.Debug("some srv records were unusable", "query", query, "err", err)
	}
	targets := map[string][]netip.Addr{}
	for _, s := range srvs {
		if s.Port != 0 && s.Target != "." {
			targets[strings.ToLower(s.Target)] = nil
		}
	}
	if err := d.resolveTargets(ctx, res, targets); err != nil {
		return nil, err
	}
	var eps []endpoint
	for _, s := range srvs {
		addrs := targets[strings.ToLower(s.Target)]
		if s.Port == 0 || len(addrs) == 0 {
			continue
		}
		// A dual-stack pod's name has an address of each family: take
		// the smallest, IPv4 first, so the choice never flaps.
		eps = append(eps, endpoint{target: strings.ToLower(s.Target), addr: addrs[0], port: s.Port})
	}
	return eps, nil
}

// resolveTargets fills targets' addresses (sorted), at most targetLookups
// at a time.
func (d *DNS) resolveTargets(ctx context.Context, res *net.Resolver, targets map[string][]netip.Addr) error {
	type result struct {
		target string
		addrs  []netip.Addr
		err    error
	}
	results := make(chan result, len(targets))
	sem := make(chan struct{}, targetLookups)
	var wg sync.WaitGroup
	for target := range targets {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			addrs, err := res.LookupNetIP(ctx, d.cfg.Network, target)
			results <- result{target, addrs, err}
		})
	}
	wg.Wait()
	close(results)
	var errs []error
	for r := range results {
		switch {
		case r.err != nil && isNotFound(r.err):
		case r.err != nil:
			errs = append(errs, fmt.Errorf("look up %s %s: %w", d.cfg.Network, r.target, r.err))
		default:
			addrs := make([]netip.Addr, 0, len(r.addrs))
			for _, a := range r.addrs {
				addrs = append(addrs, a.Unmap().WithZone(""))
			}
			slices.SortFunc(addrs, netip.Addr.Compare)
			targets[r.target] = addrs
		}
	}
	if len(errs) > 0 {
		// Report one: they are alike, and there may be hundreds.
		return fmt.Errorf("%w (and %d more failed host lookups)", errs[0], len(errs)-1)
	}
	return nil
}

// dedupe sorts pods by name and keeps, of pods with the same name, the
// first after sorting by key as well, so that an answer that names one pod
// twice yields the same pod whatever the record order.
func dedupe(pods []Pod, key func(a, b Pod) int) []Pod {
	slices.SortFunc(pods, func(a, b Pod) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), key(a, b))
	})
	return slices.CompactFunc(pods, func(a, b Pod) bool { return a.Name == b.Name })
}

// isNotFound reports whether err is DNS answering that the name has no
// such records (NXDOMAIN, or no answer of the type): Kubernetes' answer
// for a headless Service with no ready pod.
func isNotFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}

// pod makes the pod that a record gave: named as NameFrom says, with
// the HTTP endpoint at the record's port and the engine's ZMQ endpoints at
// the configured ports of the same address.
func (c DNSConfig) pod(ep endpoint) Pod {
	name := c.NamePrefix + "-" + dashed(ep.addr)
	if c.NameFrom == NameFromTarget {
		if label, _, _ := strings.Cut(ep.target, "."); label != "" {
			name = label
		}
	}
	host := ep.addr.String()
	p := Pod{
		Name:     name,
		Endpoint: c.Scheme + "://" + net.JoinHostPort(host, strconv.Itoa(int(ep.port))),
		Model:    c.Model,
		Profile:  c.Profile,
		Addr:     ep.addr,
	}
	if c.KVEventsPort > 0 {
		p.KVEvents = "tcp://" + net.JoinHostPort(host, strconv.Itoa(c.KVEventsPort))
	}
	if c.ReplayPort > 0 {
		p.Replay = "tcp://" + net.JoinHostPort(host, strconv.Itoa(c.ReplayPort))
	}
	return p
}

// dashed writes an address with '-' for '.' and ':' (10-0-3-7,
// fd00--3-7), as Kubernetes names pods' DNS records.
func dashed(a netip.Addr) string {
	return strings.NewReplacer(".", "-", ":", "-").Replace(a.String())
}
