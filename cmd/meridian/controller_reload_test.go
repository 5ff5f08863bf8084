package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional/auth"
)

// logLines collects JSON log lines written by a running command and lets
// a test wait for one.
type logLines struct {
	mu    sync.Mutex
	lines []map[string]any
	added chan struct{}
}

func newLogLines(r io.Reader) *logLines {
	l := &logLines{added: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				continue
			}
			l.mu.Lock()
			l.lines = append(l.lines, m)
			close(l.added)
			l.added = make(chan struct{})
			l.mu.Unlock()
		}
	}()
	return l
}

// wait returns the first line whose msg is msg, waiting up to 30 s.
func (l *logLines) wait(t *testing.T, msg string) map[string]any {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		l.mu.Lock()
		for _, m := range l.lines {
			if m["msg"] == msg {
				l.mu.Unlock()
				return m
			}
		}
		added := l.added
		l.mu.Unlock()
		select {
		case <-added:
		case <-deadline:
			t.Fatalf("no log line %q within 30s", msg)
		}
	}
}

// TestControllerReloadsOnSIGHUP runs `meridian controller` in this process
// with TLS and API keys, changes its configuration file, sends the process
// SIGHUP, and sees the reload logged and counted on /metrics; a second
// SIGHUP with a file that does not validate is refused, counted as an
// error, and the controller keeps serving.
func TestControllerReloadsOnSIGHUP(t *testing.T) {
	clearMeridianEnv(t)
	dir := t.TempDir()
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	pki, err := identity.InitDevPKI(filepath.Join(dir, "pki"), []string{"us-east-1"}, identity.PKIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, digest, err := auth.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "keys.yaml"), []byte("version: 1\nkeys:\n  - {name: acme, tenant: acme, sha256: "+digest+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "controller.yaml")
	writeCfg := func(policy string) {
		t.Helper()
		text := fmt.Sprintf(`region: us-east-1
controller_id: %s
listen: 127.0.0.1:0
kafka: {brokers: [%s]}
tls: {cert: %s, key: %s, client_ca: %s}
auth: {mode: api_keys, api_keys: {file: keys.yaml}}
decision: {policy: %s}
reload: {watch_interval: 0s}
`, pki.Controllers[0].Identity.ControllerID, broker.ListenAddrs()[0], pki.Controllers[0].Cert, pki.Controllers[0].Key, pki.CACert, policy)
		if err := os.WriteFile(cfgFile+".tmp", []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(cfgFile+".tmp", cfgFile); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg("ttft")

	pr, pw := io.Pipe()
	logs := newLogLines(pr)
	app := newApp()
	app.Writer, app.ErrWriter = io.Discard, pw
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- app.RunContext(ctx, []string{"meridian", "controller", "--config", cfgFile, "--log-format", "json"})
		pw.Close()
	}()
	started := logs.wait(t, "controller started")
	url, _ := started["url"].(string)

	ca, err := os.ReadFile(pki.CACert)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13}}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	reloads := func(result string) string {
		t.Helper()
		resp, err := hc.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, `meridian_config_reloads_total{result="`+result+`"} `); ok {
				return v
			}
		}
		t.Fatalf("no meridian_config_reloads_total{result=%q} on /metrics", result)
		return ""
	}
	if ok, bad := reloads("ok"), reloads("error"); ok != "0" || bad != "0" {
		t.Fatalf("before SIGHUP: ok %s, error %s", ok, bad)
	}

	writeCfg("round_robin")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	line := logs.wait(t, "configuration reloaded")
	if line["trigger"] != "signal" || fmt.Sprint(line["changed"]) != "[decision]" || reloads("ok") != "1" {
		t.Fatalf("after SIGHUP: %v, ok reloads %s", line, reloads("ok"))
	}

	writeCfg("no-such-policy")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	line = logs.wait(t, "configuration not reloaded; the running configuration stays in force")
	if !strings.Contains(fmt.Sprint(line["err"]), "no-such-policy") || reloads("error") != "1" {
		t.Fatalf("after SIGHUP with an invalid file: %v, error reloads %s", line, reloads("error"))
	}
	if resp, err := hc.Get(url + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the controller after a refused reload: %v %v", resp, err)
	}

	cancel()
	go io.Copy(io.Discard, pr)
	if err := <-done; err != nil {
		t.Fatalf("controller: %v", err)
	}
}
