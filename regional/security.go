package regional

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional/auth"
)

// MinSecretBytes is the shortest token or key a controller accepts: admin
// and hop tokens, the audit HMAC key, the pods' announce key.
const MinSecretBytes = 32

// AuthConfig is how the controller establishes who a client is: the tenant
// and data class residency decides on come from authentication, never from
// what a client claims.
type AuthConfig struct {
	// Mode: api_keys, jwt or trusted_headers (see regional/auth), with its
	// section. Empty: no client authentication, which only an insecure
	// controller accepts (X-Tenant-Id and X-Data-Class are then believed
	// from anyone: development only).
	auth.Config `yaml:",inline"`
	// Gateways, with a mode other than trusted_headers, are the gateways
	// (mTLS identity URIs or CIDRs) whose X-Tenant-Id and X-Data-Class are
	// believed as well: an authenticating gateway in front of the controller
	// beside clients with their own keys or tokens.
	Gateways auth.TrustedHeadersConfig `yaml:"gateways"`
}

// enabled reports whether clients are authenticated.
func (c AuthConfig) enabled() bool { return c.Mode != "" }

// insecureListeners names the machine-to-machine listeners and links that
// would carry plaintext beyond this host, or trust a peer unverified: Raft
// on a non-loopback address, the admin API on one, and forwarding between
// controllers (the API listener and the public URL other controllers
// reach) when the cross-region path is on, all without tls; Kafka brokers
// beyond loopback without kafka.tls, or with kafka.tls.insecure_skip_verify
// (and SASL PLAIN without it); pods scraped with pods.tls.insecure_skip_verify.
func (c Config) insecureListeners() []string {
	return append(c.Kafka.Security.InsecureUses("kafka", c.Kafka.Brokers), c.insecureNonKafka()...)
}

// insecureNonKafka is insecureListeners without the Kafka links, which
// kafka.insecure alone may accept.
func (c Config) insecureNonKafka() []string {
	var out []string
	if c.Pods.TLS != nil && c.Pods.TLS.InsecureSkipVerify {
		out = append(out, "pods.tls.insecure_skip_verify (https pods not authenticated)")
	}
	if c.TLS != nil {
		return out
	}
	if c.Raft.DataDir != "" && !loopbackAddr(c.Raft.Bind) {
		out = append(out, "raft.bind "+c.Raft.Bind)
	}
	if (c.Raft.DataDir != "" || c.Audit.Dir != "") && !loopbackAddr(c.AdminListen) {
		out = append(out, "admin_listen "+c.AdminListen)
	}
	if len(c.Gossip.Keys) > 0 {
		if !loopbackAddr(c.Listen) {
			out = append(out, "listen "+c.Listen+" (forwarding between controllers)")
		}
		if c.PublicURL != "" && !loopbackURL(c.PublicURL) {
			out = append(out, "public_url "+c.PublicURL)
		}
	}
	return out
}

// validateSecurity is the secure default: TLS for every machine-to-machine
// listener that leaves the host, client authentication wherever residency
// is decided, secrets long enough to resist guessing, unless insecure is
// set (an explicit, logged opt-out).
func (c Config) validateSecurity() error {
	if c.TLS != nil {
		if err := c.TLS.Validate(); err != nil {
			return fmt.Errorf("config: %w", err)
		}
	}
	if !c.Insecure {
		if c.Pods.TLS != nil && c.Pods.TLS.InsecureSkipVerify {
			return errors.New("config: pods.tls.insecure_skip_verify: https pods would not be authenticated (whoever answers at a pod's address would get its prompts); give pods.tls.ca instead, or set insecure: true to accept it")
		}
		l := c.insecureNonKafka()
		if !c.Kafka.Insecure {
			l = append(c.Kafka.Security.InsecureUses("kafka", c.Kafka.Brokers), l...)
		}
		if len(l) > 0 {
			return fmt.Errorf("config: plaintext on a non-loopback address: %s; configure tls (meridian certs init makes a development PKI) or set insecure: true to accept it",
				strings.Join(l, ", "))
		}
		if c.multiRegion() && !c.Auth.enabled() {
			return errors.New("config: auth.mode is required where residency is decided (api_keys, jwt or trusted_headers): tenants and data classes come from authentication, not from headers; set insecure: true to believe headers (development only)")
		}
	}
	if c.Auth.enabled() {
		if err := c.Auth.Config.Validate(); err != nil {
			return fmt.Errorf("config: %w", err)
		}
		if c.Auth.Mode == auth.ModeTrustedHeaders && (len(c.Auth.Gateways.Identities) > 0 || len(c.Auth.Gateways.CIDRs) > 0) {
			return errors.New("config: auth.gateways is for api_keys and jwt modes; trusted_headers lists its gateways in auth.trusted_headers")
		}
	}
	for _, s := range []struct{ name, v string }{{"admin_token", c.AdminToken}, {"hop_token", c.HopToken}} {
		if s.v != "" && len(s.v) < MinSecretBytes {
			return fmt.Errorf("config: %s: %d bytes, at least %d are required (openssl rand -base64 32)", s.name, len(s.v), MinSecretBytes)
		}
	}
	if c.Audit.Dir != "" && len(c.auditKey()) < max(MinSecretBytes, audit.MinKeyBytes) {
		return fmt.Errorf("config: audit.hmac_key: at least %d bytes are required (or MERIDIAN_AUDIT_KEY)", max(MinSecretBytes, audit.MinKeyBytes))
	}
	return nil
}

// loopbackAddr reports whether a listen address binds loopback only
// ("127.0.0.1:8080", "[::1]:8080", "localhost:8080"); ":8080" and
// "0.0.0.0:8080" bind every interface.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	return loopbackHost(host)
}

func loopbackURL(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && loopbackHost(u.Hostname())
}

func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// scheme is the URL scheme of this controller's listeners.
func (c Config) scheme() string {
	if c.TLS != nil {
		return "https"
	}
	return "http"
}

// openSecurity starts what the controller's security rests on: the
// listener metrics, the TLS material (reloaded as its files rotate), the
// client authenticators; and says loudly when the controller runs
// insecure.
func (c *Controller) openSecurity(ctx context.Context) error {
	var err error
	if c.listenM, err = newListenerMetrics(c.Metrics); err != nil {
		return err
	}
	insecure := prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_insecure_listeners",
		Help: "Machine-to-machine listeners or links in plaintext beyond this host (insecure: true), or 1 when client identity is believed from headers."})
	if err := c.Metrics.Register(insecure); err != nil {
		return err
	}
	if c.cfg.Insecure {
		l := c.cfg.insecureListeners()
		n := len(l)
		if !c.cfg.Auth.enabled() {
			l = append(l, "client identity from headers (no auth.mode)")
			n++
		}
		insecure.Set(float64(n))
		if n > 0 {
			c.log.Warn("INSECURE: this controller runs with insecure: true; anyone who can reach these can read or forge what they carry",
				"plaintext", l)
		}
	}
	if c.cfg.TLS != nil {
		if c.tls, err = identity.Open(ctx, *c.cfg.TLS, identity.Deps{Logger: c.log, Registerer: c.Metrics}); err != nil {
			return fmt.Errorf("tls: %w", err)
		}
	}
	if c.cfg.Auth.enabled() {
		if c.auth, err = OpenClientAuth(ctx, c.cfg.Auth, c.log, c.Metrics, c.guardKeys); err != nil {
			return err
		}
	}
	return nil
}

// closeSecurity stops the TLS reloads and the authenticators.
func (c *Controller) closeSecurity(ctx context.Context) {
	if c.auth != nil {
		_ = c.auth.Close(ctx)
	}
	if c.tls != nil {
		_ = c.tls.Close(ctx)
	}
}
