package regional

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/regional/auth"
	"github.com/meridian-llm/meridian/regional/gossip"
	"github.com/meridian-llm/meridian/regional/route"
)

// Effective returns the configuration as the controller runs it (call it
// after ApplyDefaults): every key of a section that is on holds the value
// in force, where the file left it to a default (raft.voters: 3,
// audit.max_segment_age: 1h, gorgo.profiles: the built-in hardware
// profiles, pods.allowed_endpoints: loopback and the static pods' hosts).
// Sections that are off keep their zero values (OffSections names them);
// values only known once the controller runs (the URLs of listen addresses
// such as ":8080", the consumer group's start-time suffix) are described by
// EffectiveYAML. Opening Effective() behaves as opening c.
func (c Config) Effective() Config {
	e := c
	e.Models = slices.Clone(c.Models)
	if len(e.Gorgo.Profiles) == 0 {
		e.Gorgo.Profiles = gorgo.DefaultProfiles()
	}
	if len(e.Pods.AllowedEndpoints) == 0 {
		e.Pods.AllowedEndpoints = defaultAllowedEndpoints(c.Pods.Static)
	}
	if d := c.Pods.Discovery; d.Enabled() {
		full := d.WithDefaults()
		if d.DNS.Name != "" {
			e.Pods.Discovery.DNS = full.DNS
		} else {
			e.Pods.Discovery.File = full.File
		}
	}
	if c.TLS != nil {
		t := *c.TLS
		e.TLS = &t
	}
	if c.Auth.enabled() {
		e.Auth.Config = c.Auth.Config.WithDefaults()
	}
	if c.Raft.DataDir != "" {
		g := global.DefaultConfig()
		r := &e.Raft
		if r.Advertise == "" {
			r.Advertise = r.Bind
		}
		if r.Voters == 0 {
			r.Voters = g.Voters
		}
		if r.VotersPerRegion == 0 {
			r.VotersPerRegion = g.VotersPerRegion
		}
		if r.VoterDownAfter == 0 {
			r.VoterDownAfter = g.VoterDownAfter
		}
		if r.RemoveDownAfter == 0 {
			r.RemoveDownAfter = g.RemoveDownAfter
		}
		if r.ElectionTimeout == 0 {
			r.ElectionTimeout = global.LANTiming().ElectionTimeout
			if r.WAN {
				r.ElectionTimeout = global.WANTiming().ElectionTimeout
			}
		}
		r.Join = slices.Clone(r.Join)
	}
	if len(c.Gossip.Keys) > 0 {
		g := gossip.DefaultConfig()
		gc := &e.Gossip
		if gc.Bind == "" {
			gc.Bind = fmt.Sprintf("%s:%d", g.BindAddr, g.BindPort)
		}
		if gc.Label == "" {
			gc.Label = g.Label
		}
		if gc.ReplicaInterval == 0 {
			gc.ReplicaInterval = g.ReplicaInterval
			if gc.Fast {
				var f gossip.Config
				fastGossip(&f)
				gc.ReplicaInterval = f.ReplicaInterval
			}
		}
		gc.StateFile = c.gossipStateFile()
	}
	if c.Audit.Dir != "" {
		a := audit.DefaultConfig()
		if e.Audit.CheckpointInterval == 0 {
			e.Audit.CheckpointInterval = a.CheckpointInterval
		}
		if e.Audit.MaxSegmentBytes == 0 {
			e.Audit.MaxSegmentBytes = a.MaxSegmentBytes
		}
		if e.Audit.MaxSegmentAge == 0 {
			e.Audit.MaxSegmentAge = a.MaxSegmentAge
		}
	}
	if c.AutoFailover.Enabled {
		a := global.DefaultAutoFailoverConfig()
		f := &e.AutoFailover
		if f.Interval == 0 {
			f.Interval = a.Interval
		}
		if f.MinHealthyPods == 0 {
			f.MinHealthyPods = a.MinHealthyPods
		}
		if f.ReportMaxAge == 0 {
			f.ReportMaxAge = a.ReportMaxAge
		}
		if f.Grace == 0 {
			f.Grace = a.Grace
		}
		if f.HoldDown == 0 {
			f.HoldDown = a.HoldDown
		}
	}
	return e
}

// defaultAllowedEndpoints is pods.allowed_endpoints when the file gives
// none: loopback and the hosts of the static pods.
func defaultAllowedEndpoints(static []route.PodInfo) []string {
	allowed := []string{"127.0.0.0/8", "::1/128", "localhost"}
	for _, p := range static {
		if h, err := endpointHost(p.Endpoint); err == nil && !slices.Contains(allowed, h) {
			allowed = append(allowed, h)
		}
	}
	return allowed
}

// OffSections names the sections of the configuration that are turned
// off, each with why (the key that would turn it on): their keys have no
// effect.
func (c Config) OffSections() map[string]string {
	off := map[string]string{}
	if c.TLS == nil {
		off["tls"] = "off: plaintext API, admin API, Raft and forwarding (allowed on loopback, or with insecure: true)"
	}
	if !c.Auth.enabled() {
		off["auth"] = "off: no client authentication (auth.mode not set); tenant and data class come from headers"
	}
	if c.Raft.DataDir == "" {
		off["raft"] = "off: raft.data_dir not set (no global tier)"
	}
	if len(c.Gossip.Keys) == 0 {
		off["gossip"] = "off: gossip.keys not set (no cross-region summaries or forwarding)"
	}
	if c.Audit.Dir == "" {
		off["audit"] = "off: audit.dir not set (no audit log)"
	}
	if !c.AutoFailover.Enabled || c.Raft.DataDir == "" {
		off["auto_failover"] = "off: auto_failover.enabled not set (with raft)"
	}
	if c.Auth.enabled() {
		for _, m := range []auth.Mode{auth.ModeAPIKeys, auth.ModeJWT, auth.ModeTrustedHeaders} {
			if m != c.Auth.Mode {
				off["auth."+string(m)] = "off: auth.mode is " + string(c.Auth.Mode)
			}
		}
		if c.Auth.Mode == auth.ModeTrustedHeaders {
			off["auth.default_rate_limit"] = "off: trusted_headers identities take auth.trusted_headers.rate_limit"
		}
		if len(c.Auth.Gateways.Identities) == 0 && len(c.Auth.Gateways.CIDRs) == 0 {
			off["auth.gateways"] = "not set: no gateway's X-Tenant-Id or X-Data-Class is believed"
		}
	}
	d := c.Pods.Discovery
	switch {
	case !d.Enabled():
		off["pods.discovery"] = "off: neither pods.discovery.dns.name nor pods.discovery.file.path is set"
	case d.DNS.Name != "":
		off["pods.discovery.file"] = "off: the dns source is used"
	default:
		off["pods.discovery.dns"] = "off: the file source is used"
	}
	if c.Pods.TLS == nil {
		off["pods.tls"] = "not set: https pods are verified against the system's roots, without a client certificate"
	}
	return off
}

// notedDefaults describes the keys whose default is decided when the
// controller starts (an address it listens on, its start time), for the
// keys the configuration leaves empty.
func (c Config) notedDefaults() map[string]string {
	notes := map[string]string{}
	scheme := c.scheme()
	if c.PublicURL == "" {
		notes["public_url"] = "default: " + scheme + "://<the API's listen address, as bound>"
	}
	if c.AdminURL == "" && (c.Raft.DataDir != "" || c.Audit.Dir != "") {
		notes["admin_url"] = "default: " + scheme + "://<the admin API's listen address, as bound>"
	}
	if c.Kafka.GroupID == "" {
		notes["kafka.group_id"] = fmt.Sprintf("default: meridian-%s-%s-<start time> (a group of its own per start)", c.Region, c.ControllerID)
	}
	if c.Kafka.ReadAheadBytes == 0 {
		notes["kafka.read_ahead_bytes"] = fmt.Sprintf("default: 16 x fetch_max_bytes = %d", c.Kafka.readAhead())
	}
	if c.PolicyFile == "" {
		if c.multiRegion() {
			notes["policy_file"] = "not set: the shipped default policy (stay in the origin zone)"
		} else {
			notes["policy_file"] = "not set: no residency decisions without a cross-region component"
		}
	}
	if c.Runtime.MaxProcs == 0 {
		if c.multiRegion() {
			notes["runtime.max_procs"] = "the Go runtime's default (cross-region components are on; GOMAXPROCS in the environment wins)"
		} else {
			notes["runtime.max_procs"] = "adaptive: 1 while the process uses under 0.3 of a core, else the Go runtime's default (GOMAXPROCS in the environment wins)"
		}
	}
	if len(c.Gossip.Keys) > 0 && c.Gossip.Advertise == "" {
		notes["gossip.advertise"] = "default: the bind address (for 0.0.0.0, the host's private address)"
	}
	return notes
}

// EffectiveYAML is the configuration as `meridian controller --check`
// prints it: Effective with its secrets redacted, each section that is off
// shown as {} with a comment saying why, and each key whose default is
// decided at start commented with it. The output loads as a configuration
// that means the same (but for the redacted secrets).
func (c Config) EffectiveYAML() ([]byte, error) {
	var doc yaml.Node
	if err := doc.Encode(c.Effective().Redacted()); err != nil {
		return nil, fmt.Errorf("effective config: %w", err)
	}
	for path, why := range c.OffSections() {
		_, v := lookupKey(&doc, path)
		if v == nil {
			continue
		}
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			v.LineComment = why // an unset pointer section stays null
			continue
		}
		*v = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Style: yaml.FlowStyle, LineComment: why}
	}
	for path, note := range c.notedDefaults() {
		if k, v := lookupKey(&doc, path); v != nil {
			k.LineComment = note
		}
	}
	b, err := yaml.Marshal(&doc)
	if err != nil {
		return nil, fmt.Errorf("effective config: %w", err)
	}
	return b, nil
}

// lookupKey finds the key and value nodes of a dotted path in a mapping.
func lookupKey(n *yaml.Node, path string) (key, value *yaml.Node) {
	for _, part := range strings.Split(path, ".") {
		if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
			n = n.Content[0]
		}
		if n.Kind != yaml.MappingNode {
			return nil, nil
		}
		found := false
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == part {
				key, value, n = n.Content[i], n.Content[i+1], n.Content[i+1]
				found = true
				break
			}
		}
		if !found {
			return nil, nil
		}
	}
	return key, value
}
