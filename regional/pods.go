package regional

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync/atomic"

	"go.yaml.in/yaml/v3"

	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional/discovery"
	"github.com/meridian-llm/meridian/regional/kvevents"
	"github.com/meridian-llm/meridian/regional/route"
)

// PodsConfig is where the controller learns of its pods and which pod
// announcements it believes. A PodUp names the endpoint prompts are then
// sent to: whoever can write to the region's topic could otherwise point
// them anywhere.
type PodsConfig struct {
	// Static pods (name, endpoint, model, profile). Pods also join by the
	// PodUp events on the region's topic.
	Static []route.PodInfo `yaml:"static"`
	// AllowedEndpoints are the hosts a PodUp's endpoint may name: CIDRs
	// ("10.0.0.0/8", "fd00::/8") for IP hosts and host patterns
	// ("*.vllm.svc.cluster.local", path.Match syntax) for names. Default:
	// the hosts of the static pods, and loopback.
	AllowedEndpoints []string `yaml:"allowed_endpoints"`
	// AnnounceKey, when set, must have signed every PodUp: the message
	// carries the HMAC-SHA256 of the announcement under this key in the
	// meridian-announce-mac header (kvevents.AnnounceMAC). At least 32
	// bytes (MERIDIAN_ANNOUNCE_KEY).
	AnnounceKey string `yaml:"announce_key"`
	// TLS is how pods with an https endpoint are reached, for scraping
	// their /metrics and proxying requests: ca (the pods' CA; default the
	// system's roots), cert and key (a client certificate, for pods that
	// require one), server_name, insecure_skip_verify (insecure controllers
	// only), min_version. A pod is https when its endpoint says so.
	TLS *identity.ClientTLSConfig `yaml:"tls"`
	// RequireHTTPS refuses pods whose endpoint is plain http: static pods
	// fail validation, such a PodUp is refused (reason plaintext_endpoint).
	// Default false: each pod's endpoint decides.
	RequireHTTPS bool `yaml:"require_https"`
	// Discovery follows the pods without static lists: a Kubernetes
	// headless Service through DNS, or a file (see regional/discovery).
	// Pods it finds join the registry with their endpoints and leave when
	// it stops finding them. A discovered pod is allowed by construction:
	// a PodUp naming it (the bridge announces the same pods) is believed
	// for its discovered endpoint whatever allowed_endpoints says; other
	// announcements still need allowed_endpoints. Default: none.
	Discovery discovery.Config `yaml:"discovery"`
}

// UnmarshalYAML also accepts the earlier form of the section, a plain list
// of static pods.
func (c *PodsConfig) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.SequenceNode {
		return n.Decode(&c.Static)
	}
	if n.Kind == yaml.MappingNode {
		// A node's Decode does not inherit the file decoder's KnownFields:
		// check the keys here, so a misspelt one is still an error.
		for i := 0; i+1 < len(n.Content); i += 2 {
			switch k := n.Content[i]; k.Value {
			case "static", "allowed_endpoints", "announce_key", "require_https", "discovery":
			case "tls":
				if err := knownKeys(n.Content[i+1], "pods.tls", "ca", "cert", "key", "server_name", "insecure_skip_verify", "min_version"); err != nil {
					return err
				}
			default:
				return fmt.Errorf("line %d: pods: unknown key %q (want static, allowed_endpoints, announce_key, tls, require_https, discovery)", k.Line, k.Value)
			}
		}
	}
	type plain PodsConfig
	p := plain(*c) // absent keys keep their defaults
	if err := n.Decode(&p); err != nil {
		return err
	}
	*c = PodsConfig(p)
	return nil
}

// knownKeys refuses a key of the mapping n that is not one of keys.
func knownKeys(n *yaml.Node, section string, keys ...string) error {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; !slices.Contains(keys, k.Value) {
			return fmt.Errorf("line %d: %s: unknown key %q (want %s)", k.Line, section, k.Value, strings.Join(keys, ", "))
		}
	}
	return nil
}

// Validate names the first field that is wrong.
func (c PodsConfig) Validate() error {
	for i, p := range c.Static {
		if p.Name == "" || p.Endpoint == "" {
			return fmt.Errorf("pods.static[%d]: name and endpoint are required", i)
		}
		if _, err := endpointHost(p.Endpoint); err != nil {
			return fmt.Errorf("pods.static[%d] (%s): %w", i, p.Name, err)
		}
		if c.RequireHTTPS && !httpsEndpoint(p.Endpoint) {
			return fmt.Errorf("pods.static[%d] (%s): endpoint %q is not https and pods.require_https is set", i, p.Name, p.Endpoint)
		}
		if p.Engine != "" && !slices.Contains(kvevents.Engines(), p.Engine) {
			return fmt.Errorf("pods.static[%d] (%s): engine %q: want one of %s", i, p.Name, p.Engine, strings.Join(kvevents.Engines(), ", "))
		}
		if p.KVBlocks < 0 {
			return fmt.Errorf("pods.static[%d] (%s): kv_blocks = %d: want >= 0", i, p.Name, p.KVBlocks)
		}
	}
	for i, a := range c.AllowedEndpoints {
		if strings.Contains(a, "/") {
			if _, err := netip.ParsePrefix(a); err != nil {
				return fmt.Errorf("pods.allowed_endpoints[%d] = %q: not a CIDR: %v", i, a, err)
			}
			continue
		}
		if _, err := path.Match(a, ""); err != nil || a == "" {
			return fmt.Errorf("pods.allowed_endpoints[%d] = %q: not a host pattern", i, a)
		}
	}
	if c.AnnounceKey != "" && len(c.AnnounceKey) < 32 {
		return fmt.Errorf("pods.announce_key: %d bytes, at least 32 are required", len(c.AnnounceKey))
	}
	if c.Discovery.Enabled() {
		if err := c.Discovery.Validate(); err != nil {
			return fmt.Errorf("pods.%w", err)
		}
	}
	if c.TLS != nil {
		if err := c.TLS.Validate("pods.tls"); err != nil {
			return err
		}
	}
	return nil
}

// httpsEndpoint reports whether a pod's endpoint is an https URL.
func httpsEndpoint(endpoint string) bool {
	u, err := url.Parse(endpoint)
	return err == nil && u.Scheme == "https"
}

// Why a PodUp was not believed (meridian_ingest_podup_rejected_total).
const (
	rejectKeyMismatch = "key_mismatch"         // its pod is not the message's key
	rejectBadEndpoint = "bad_endpoint"         // not an http(s) URL with a host
	rejectNotAllowed  = "endpoint_not_allowed" // its host is not in allowed_endpoints
	rejectBadMAC      = "bad_mac"              // missing or wrong meridian-announce-mac
	rejectPlaintext   = "plaintext_endpoint"   // http while pods.require_https is set
)

var podUpRejections = []string{rejectKeyMismatch, rejectBadEndpoint, rejectNotAllowed, rejectBadMAC, rejectPlaintext}

// podGate decides which PodUp announcements to believe.
type podGate struct {
	key   []byte
	https bool
	// allowed is pods.allowed_endpoints (or its default), replaced whole
	// by a reload (setAllowed).
	allowed atomic.Pointer[allowList]
	// discovered maps the pods discovery found to their endpoints: a PodUp
	// of one of them naming that endpoint is allowed (nil: none).
	discovered atomic.Pointer[map[string]string]
}

// allowList is the hosts a PodUp's endpoint may name.
type allowList struct {
	prefixes []netip.Prefix
	patterns []string
}

// newPodGate builds the gate of a valid PodsConfig.
func newPodGate(c PodsConfig) *podGate {
	g := &podGate{key: []byte(c.AnnounceKey), https: c.RequireHTTPS}
	g.setAllowed(c)
	return g
}

// setAllowed replaces the allowed endpoints with those of c (a valid
// PodsConfig): its allowed_endpoints, or by default loopback and the hosts
// of its static pods.
func (g *podGate) setAllowed(c PodsConfig) {
	allowed := c.AllowedEndpoints
	if len(allowed) == 0 {
		allowed = defaultAllowedEndpoints(c.Static)
	}
	l := &allowList{}
	for _, a := range allowed {
		if pfx, err := netip.ParsePrefix(a); err == nil {
			l.prefixes = append(l.prefixes, pfx)
		} else if ip, err := netip.ParseAddr(a); err == nil {
			l.prefixes = append(l.prefixes, netip.PrefixFrom(ip, ip.BitLen()))
		} else {
			l.patterns = append(l.patterns, strings.ToLower(a))
		}
	}
	g.allowed.Store(l)
}

// check returns "" when the PodUp in a message with key may be believed,
// else the reason it may not.
func (g *podGate) check(key string, u *kvevents.PodUp, mac string) string {
	if u.Pod != key {
		return rejectKeyMismatch
	}
	host, err := endpointHost(u.Endpoint)
	if err != nil {
		return rejectBadEndpoint
	}
	if !g.allows(host) && !g.isDiscovered(u.Pod, u.Endpoint) {
		return rejectNotAllowed
	}
	if g.https && !httpsEndpoint(u.Endpoint) {
		return rejectPlaintext
	}
	if len(g.key) > 0 && !kvevents.AnnounceMACValid(g.key, u, mac) {
		return rejectBadMAC
	}
	return ""
}

// setDiscovered replaces the discovered pods (name -> endpoint).
func (g *podGate) setDiscovered(m map[string]string) { g.discovered.Store(&m) }

// isDiscovered reports whether discovery found pod at endpoint.
func (g *podGate) isDiscovered(pod, endpoint string) bool {
	m := g.discovered.Load()
	if m == nil {
		return false
	}
	ep, ok := (*m)[pod]
	return ok && strings.TrimRight(ep, "/") == strings.TrimRight(endpoint, "/")
}

func (g *podGate) allows(host string) bool {
	l := g.allowed.Load()
	if ip, err := netip.ParseAddr(host); err == nil {
		ip = ip.Unmap()
		for _, p := range l.prefixes {
			if p.Contains(ip) {
				return true
			}
		}
		return false
	}
	for _, p := range l.patterns {
		if ok, _ := path.Match(p, host); ok {
			return true
		}
	}
	return false
}

// endpointHost checks that endpoint is a base URL prompts may be sent to
// (http or https, a host, no credentials, query or fragment) and returns
// its host, lower case, without brackets or port.
func endpointHost(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	switch {
	case err != nil:
		return "", fmt.Errorf("endpoint %q: %w", endpoint, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("endpoint %q: want an http or https URL", endpoint)
	case u.Host == "" || u.Hostname() == "":
		return "", fmt.Errorf("endpoint %q: no host", endpoint)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return "", errors.New("endpoint " + endpoint + ": no credentials, query or fragment allowed")
	}
	if p := u.Port(); p != "" {
		if _, err := net.LookupPort("tcp", p); err != nil {
			return "", fmt.Errorf("endpoint %q: port %q", endpoint, p)
		}
	}
	return strings.ToLower(u.Hostname()), nil
}
