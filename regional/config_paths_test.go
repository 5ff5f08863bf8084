package regional

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestLoadConfigRelativePaths: every file and directory a configuration
// names by a relative path is found beside the configuration file, whatever
// the working directory; absolute paths and ${VAR}s are kept as given.
func TestLoadConfigRelativePaths(t *testing.T) {
	root := t.TempDir()
	confDir := filepath.Join(root, "etc", "meridian")
	if err := os.MkdirAll(confDir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MERIDIAN_TEST_POLICY", "rel-policy-from-env.yaml")
	abs := filepath.Join(root, "abs", "api-keys.yaml")
	text := `region: us-east-1
listen: 127.0.0.1:0
policy_file: ${MERIDIAN_TEST_POLICY}
models:
  - name: m
    dir: rel-models/m
tls:
  cert: rel-tls/ctl.pem
  key: ./rel-tls/ctl-key.pem
  client_ca: ../rel-ca.pem
auth:
  mode: api_keys
  api_keys:
    file: ` + abs + `
  jwt:
    jwks_file: rel-jwks.json
kafka:
  brokers: [127.0.0.1:9092]
  tls:
    ca: rel-kafka/ca.pem
    cert: rel-kafka/client.pem
    key: rel-kafka/client-key.pem
  sasl:
    mechanism: scram-sha-512
    username: u
    password_file: rel-kafka/password
pods:
  tls:
    ca: rel-pods/ca.pem
    cert: rel-pods/client.pem
    key: rel-pods/client-key.pem
  discovery:
    file:
      path: rel-pods.yaml
raft:
  data_dir: rel-raft
audit:
  dir: rel-audit
gossip:
  state_file: rel-gossip-state.json
`
	path := filepath.Join(confDir, "controller.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	// Load it from elsewhere, by a relative name.
	t.Chdir(root)
	cfg, err := LoadConfig(filepath.Join("etc", "meridian", "controller.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	in := func(name string) string { return filepath.Join(confDir, name) }
	for _, c := range []struct{ key, got, want string }{
		{"policy_file (from ${VAR})", cfg.PolicyFile, in("rel-policy-from-env.yaml")},
		{"models[0].dir", cfg.Models[0].Dir, in("rel-models/m")},
		{"tls.cert", cfg.TLS.Cert, in("rel-tls/ctl.pem")},
		{"tls.key", cfg.TLS.Key, in("rel-tls/ctl-key.pem")},
		{"tls.client_ca", cfg.TLS.ClientCA, filepath.Join(root, "etc", "rel-ca.pem")},
		{"auth.api_keys.file (absolute)", cfg.Auth.APIKeys.File, abs},
		{"auth.jwt.jwks_file", cfg.Auth.JWT.JWKSFile, in("rel-jwks.json")},
		{"kafka.tls.ca", cfg.Kafka.Security.TLS.CA, in("rel-kafka/ca.pem")},
		{"kafka.tls.cert", cfg.Kafka.Security.TLS.Cert, in("rel-kafka/client.pem")},
		{"kafka.tls.key", cfg.Kafka.Security.TLS.Key, in("rel-kafka/client-key.pem")},
		{"kafka.sasl.password_file", cfg.Kafka.Security.SASL.PasswordFile, in("rel-kafka/password")},
		{"pods.tls.ca", cfg.Pods.TLS.CA, in("rel-pods/ca.pem")},
		{"pods.tls.cert", cfg.Pods.TLS.Cert, in("rel-pods/client.pem")},
		{"pods.tls.key", cfg.Pods.TLS.Key, in("rel-pods/client-key.pem")},
		{"pods.discovery.file.path", cfg.Pods.Discovery.File.Path, in("rel-pods.yaml")},
		{"raft.data_dir", cfg.Raft.DataDir, in("rel-raft")},
		{"audit.dir", cfg.Audit.Dir, in("rel-audit")},
		{"gossip.state_file", cfg.Gossip.StateFile, in("rel-gossip-state.json")},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.key, c.got, c.want)
		}
	}
	// No relative name is left anywhere in the loaded configuration.
	walkStrings(reflect.ValueOf(cfg), "", func(field, v string) {
		if strings.Contains(v, "rel-") && !filepath.IsAbs(v) {
			t.Errorf("%s = %q: still relative", field, v)
		}
	})
}

// walkStrings calls f with every string reachable from v (fields, pointers,
// slices, maps).
func walkStrings(v reflect.Value, path string, f func(field, v string)) {
	switch v.Kind() {
	case reflect.String:
		f(path, v.String())
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			walkStrings(v.Elem(), path, f)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				walkStrings(v.Field(i), path+"."+v.Type().Field(i).Name, f)
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			walkStrings(v.Index(i), path+"[]", f)
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			walkStrings(v.MapIndex(k), path+"["+k.String()+"]", f)
		}
	}
}
