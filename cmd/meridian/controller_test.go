package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func runApp(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	app := newApp()
	var out, errOut bytes.Buffer
	app.Writer, app.ErrWriter = &out, &errOut
	err := app.Run(append([]string{"meridian"}, args...))
	return out.String(), errOut.String(), err
}

func TestControllerCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("region: us-east-1\nlisten: 127.0.0.1:0\nkafka:\n  brokers: [127.0.0.1:9092]\n"), 0o644)
	out, _, err := runApp(t, "controller", "--config", good, "--check")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "region: us-east-1") || !strings.Contains(out, "topic: meridian.kv-events.us-east-1") {
		t.Fatalf("effective config:\n%s", out)
	}
	// Flags override the file.
	out, _, err = runApp(t, "controller", "--config", good, "--check", "--region", "eu-west-1")
	if err != nil || !strings.Contains(out, "region: eu-west-1") {
		t.Fatalf("override: %v\n%s", err, out)
	}

	unknown := filepath.Join(dir, "unknown.yaml")
	os.WriteFile(unknown, []byte("region: r\nlisten: 127.0.0.1:0\nkafka: {brokers: [127.0.0.1:9092]}\nbrokerz: [x]\n"), 0o644)
	if _, _, err := runApp(t, "controller", "--config", unknown, "--check"); err == nil || !strings.Contains(err.Error(), "brokerz") {
		t.Fatalf("unknown key: %v", err)
	}
	noRegion := filepath.Join(dir, "noregion.yaml")
	os.WriteFile(noRegion, []byte("listen: 127.0.0.1:0\nkafka: {brokers: [127.0.0.1:9092]}\n"), 0o644)
	_, _, err = runApp(t, "controller", "--config", noRegion, "--check")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), "region is required") {
		t.Fatalf("missing region: %v", err)
	}
	if _, _, err := runApp(t, "controller", "--config", filepath.Join(dir, "absent.yaml")); err == nil {
		t.Fatal("missing file accepted")
	}
	if _, _, err := runApp(t, "controller", "--config", good, "--log-level", "loud"); err == nil || !strings.Contains(err.Error(), "log-level") {
		t.Fatalf("bad log level: %v", err)
	}
}

func TestKafkaDev(t *testing.T) {
	pr, pw := io.Pipe()
	app := newApp()
	app.Writer, app.ErrWriter = pw, io.Discard
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- app.RunContext(ctx, []string{"meridian", "kafka-dev", "--addr", "127.0.0.1:0"})
		pw.Close()
	}()
	addr, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", strings.TrimSpace(addr), 5*time.Second)
	if err != nil {
		t.Fatalf("broker at %q: %v", addr, err)
	}
	conn.Close()
	cancel()
	go io.Copy(io.Discard, pr)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, _, err := runApp(t, "kafka-dev", "--brokers", "0"); err == nil {
		t.Fatal("0 brokers accepted")
	}
}

func TestControllerSecretsFromEnvAndRedacted(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "raft.yaml")
	os.WriteFile(cfg, []byte("region: us-east-1\nlisten: 127.0.0.1:0\nkafka: {brokers: [127.0.0.1:9092]}\n"+
		"raft: {data_dir: "+dir+"/raft, advertise: \"${TEST_RAFT_ADDR}\"}\ninsecure: true\n"+
		"audit: {dir: "+dir+"/audit, hmac_key: audit-hmac-key-of-thirty-two-bytes}\n"), 0o644)
	// No admin token anywhere: refused.
	if _, _, err := runApp(t, "controller", "--config", cfg, "--check"); err == nil || !strings.Contains(err.Error(), "admin_token") {
		t.Fatalf("raft without an admin token: %v", err)
	}
	t.Setenv("MERIDIAN_ADMIN_TOKEN", "s3cret")
	if _, _, err := runApp(t, "controller", "--config", cfg, "--check"); err == nil || !strings.Contains(err.Error(), "admin_token: 6 bytes, at least 32") {
		t.Fatalf("a short admin token: %v", err)
	}
	t.Setenv("MERIDIAN_ADMIN_TOKEN", "s3cret-token-value-of-thirty-two-bytes")
	t.Setenv("TEST_RAFT_ADDR", "10.1.2.3:7400")
	out, _, err := runApp(t, "controller", "--config", cfg, "--check")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "s3cret") || !strings.Contains(out, "admin_token: <redacted>") {
		t.Fatalf("secret printed or not redacted:\n%s", out)
	}
	if !strings.Contains(out, "advertise: 10.1.2.3:7400") || !strings.Contains(out, "bind: 0.0.0.0:7400") {
		t.Fatalf("env expansion or raft bind default missing:\n%s", out)
	}
}

func TestEngineSimZMQFlagsExclusive(t *testing.T) {
	_, _, err := runApp(t, "engine-sim", "--addr", "127.0.0.1:0", "--kafka-brokers", "127.0.0.1:9", "--zmq-endpoint", "tcp://127.0.0.1:0")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), "exclude each other") {
		t.Fatalf("kafka and zmq together: %v", err)
	}
}
