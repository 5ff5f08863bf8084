package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/meridian-llm/meridian/global/identity"
)

// zeroByDefault lists the keys whose value in force is genuinely zero,
// empty or false when the file leaves them out (a path pattern: [] stands
// for any list index), each with what it means. Every other key that
// `controller --check` prints as a zero must carry a comment saying what
// applies instead.
var zeroByDefault = map[string]string{
	"expected_blocks":                   "0: the index grows as needed",
	"kafka.kv_blocks_per_pod":           "0: each pod's re-keyer grows as its cache fills",
	"kafka.insecure":                    "false: brokers beyond loopback need tls",
	"pods.static":                       "no static pods",
	"pods.announce_key":                 "no key: announcements are not signed",
	"pods.require_https":                "false: each pod's endpoint decides",
	"pods.discovery.dns.port":           "0: each SRV record's port",
	"pods.discovery.dns.server":         "none: the system's resolvers",
	"pods.discovery.dns.model":          "none: each pod's announcement names its model",
	"pods.discovery.dns.profile":        "none: each pod's announcement names its hardware",
	"pods.discovery.dns.kv_events_port": "0: no ZMQ endpoint (the controller does not subscribe)",
	"pods.discovery.dns.replay_port":    "0: no replay endpoint",
	"server.allow_policy_override":      "false: clients cannot pick the decision policy",
	"gorgo.egress_usd_per_gb":           "0: the egress term is off",
	"gorgo.ms_per_usd":                  "0: the egress term is off",
	"gorgo.profiles[].attn_tokens":      "0: the profile has no attention term",
	"admin_url":                         "no admin API without raft or audit",
	"admin_token":                       "not set (a secret: <redacted> when set)",
	"hop_token":                         "not set (a secret: <redacted> when set)",
	"insecure":                          "false: the secure default",
	"shutdown.drain_delay":              "0: under Kubernetes the preStop hook waits instead",
	"raft.bootstrap":                    "false: this controller joins a cluster",
	"raft.bootstrap_id":                 "none: raft.bootstrap decides",
	"raft.join":                         "none",
	"raft.wan":                          "false: LAN timing",
	"gossip.join":                       "none: raft members and remembered peers seed it",
	"gossip.static_rtt":                 "none: measured RTTs only",
	"gossip.static_rtt_override":        "false: measured RTTs win",
	"gossip.fast":                       "false: WAN intervals",
}

// TestControllerCheckPrintsEffectiveValues: `controller --check` prints the
// value in force of every key, defaults included: a key printed as zero,
// empty or false is either genuinely that by default (zeroByDefault) or
// commented with what applies (a section that is off, a default decided at
// start). Checked on a minimal configuration and on a production one
// (TLS, API keys, Raft, gossip, audit, automatic failover, DNS discovery).
func TestControllerCheckPrintsEffectiveValues(t *testing.T) {
	clearMeridianEnv(t)
	dir := t.TempDir()
	pki, err := identity.InitDevPKI(filepath.Join(dir, "pki"), []string{"us-east-1"}, identity.PKIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keys := write("keys.yaml", "version: 1\nkeys: []\n")
	policy, err := os.ReadFile(filepath.Join(deployRoot, "policies", "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	write("policy.yaml", string(policy))
	minimal := write("minimal.yaml", "region: us-east-1\nlisten: 127.0.0.1:0\nkafka: {brokers: [127.0.0.1:9092]}\n")
	full := write("full.yaml", fmt.Sprintf(`region: us-east-1
controller_id: %s
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
admin_token: %s
kafka: {brokers: [127.0.0.1:9092]}
tls: {cert: %s, key: %s, client_ca: %s}
auth: {mode: api_keys, api_keys: {file: %s}}
policy_file: policy.yaml
raft: {data_dir: raft, bind: 127.0.0.1:0}
gossip: {bind: 127.0.0.1:0, keys: [%s]}
audit: {dir: audit, hmac_key: %s}
auto_failover: {enabled: true}
pods:
  tls: {ca: %s}
  discovery: {dns: {name: vllm.default.svc.cluster.local}}
`, pki.Controllers[0].Identity.ControllerID, strings.Repeat("a", 32), pki.Controllers[0].Cert, pki.Controllers[0].Key, pki.CACert,
		keys, "a2V5LWtleS1rZXkta2V5LWtleS1rZXkta2V5LWtleSE=", strings.Repeat("h", 32), pki.CACert))

	for _, file := range []string{minimal, full} {
		code, out := runCode(t, "controller", "--check", "--config", file)
		if code != 0 {
			t.Fatalf("controller --check --config %s: exit %d\n%s", file, code, out)
		}
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatalf("%s: output is not YAML: %v\n%s", file, err, out)
		}
		var zeros []string
		walkYAML(doc.Content[0], "", "", func(path, comment string, v *yaml.Node) {
			if comment != "" || !zeroValue(v) {
				return
			}
			if _, ok := zeroByDefault[path]; ok {
				return
			}
			zeros = append(zeros, fmt.Sprintf("%s: %s", path, v.Value))
		})
		if len(zeros) > 0 {
			t.Errorf("%s: --check prints zeros for keys whose default is not zero, without saying what applies:\n  %s\n%s",
				filepath.Base(file), strings.Join(zeros, "\n  "), out)
		}
	}
	// The production file's defaulted keys show their values.
	_, out := runCode(t, "controller", "--check", "--config", full)
	for _, want := range []string{"voters: 3", "voters_per_region: 1", "voter_down_after: 10s", "remove_down_after: 24h0m0s",
		"election_timeout: 1s", "label: meridian-wan", "replica_interval: 200ms", "checkpoint_interval: 30s",
		"max_segment_bytes: 67108864", "max_segment_age: 1h0m0s", "min_healthy_pods: 1", "hold_down: 1m0s",
		"reload_interval: 10s", "min_version: \"1.3\"", "state_file: " + filepath.Join(dir, "raft", "gossip-state.json"),
		"policy_file: " + filepath.Join(dir, "policy.yaml"), "lookup: srv", "admin_token: <redacted>",
		"jwt: {} # off: auth.mode is api_keys", "grace: 30s"} {
		if !strings.Contains(out, want) {
			t.Errorf("--check of the production file lacks %q:\n%s", want, out)
		}
	}
}

// walkYAML calls f for every scalar, empty list or empty map of a mapping
// tree with its dotted path ([] for list items) and the comment on its key
// or on itself.
func walkYAML(n *yaml.Node, path, comment string, f func(path, comment string, v *yaml.Node)) {
	switch n.Kind {
	case yaml.MappingNode:
		if len(n.Content) == 0 {
			f(path, comment+n.LineComment, n)
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			walkYAML(v, p, comment+k.LineComment+v.LineComment, f)
		}
	case yaml.SequenceNode:
		if len(n.Content) == 0 {
			f(path, comment+n.LineComment, n)
		}
		for _, v := range n.Content {
			walkYAML(v, path+"[]", comment, f)
		}
	case yaml.ScalarNode:
		f(path, comment+n.LineComment, n)
	}
}

// zeroValue reports whether a node is a zero, empty or false value.
func zeroValue(n *yaml.Node) bool {
	switch n.Kind {
	case yaml.MappingNode, yaml.SequenceNode:
		return len(n.Content) == 0
	case yaml.ScalarNode:
		return slices.Contains([]string{"", "0", "0s", "false", "null"}, n.Value) || n.Tag == "!!null"
	}
	return false
}
