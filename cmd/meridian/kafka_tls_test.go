package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedWriter collects what a command writes from its goroutines.
type lockedWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// runBackground runs the app with args until the test ends (its context is
// cancelled then, and the command must return), and returns the first line
// of its output (standard output and error) that contains until. It
// returns only after that line: urfave/cli's flag parsing writes package
// variables, so two commands must not start at once.
func runBackground(t *testing.T, until string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	app := newApp()
	app.Writer, app.ErrWriter = pw, pw
	done := make(chan error, 1)
	go func() {
		err := app.RunContext(ctx, append([]string{"meridian"}, args...))
		pw.Close()
		done <- err
	}()
	var out lockedWriter
	drained := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: %v\n%s", args[0], err, out.String())
		}
		<-drained
	})
	r := bufio.NewReader(pr)
	for {
		line, err := r.ReadString('\n')
		out.Write([]byte(line))
		if err != nil {
			close(drained)
			t.Fatalf("%s ended before printing %q: %v\n%s", args[0], until, err, out.String())
		}
		if strings.Contains(line, until) {
			go func() {
				defer close(drained)
				_, _ = io.Copy(&out, r)
			}()
			return line
		}
	}
}

// TestKafkaCLIOverTLSAndSCRAM: the development PKI from `certs init`, a
// `kafka-dev` broker that speaks only TLS and accepts one SCRAM user, an
// `engine-sim` serving https that publishes to it with --kafka-ca and
// --kafka-sasl-*, and `events tail` reading its PodUp back with the same
// flags.
func TestKafkaCLIOverTLSAndSCRAM(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := runApp(t, "certs", "init", "--dir", dir, "--regions", "kafka"); err != nil {
		t.Fatal(err)
	}
	ca, cert, key := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ctl-kafka.pem"), filepath.Join(dir, "ctl-kafka-key.pem")
	pass := filepath.Join(dir, "kafka-password")
	if err := os.WriteFile(pass, []byte("cli-secret-0b9d\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimSpace(runBackground(t, "127.0.0.1:", "kafka-dev", "--addr", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key,
		"--sasl-user", "meridian", "--sasl-mechanism", "scram-sha-512", "--sasl-password-file", pass))
	security := []string{"--kafka-ca", ca, "--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-user", "meridian", "--kafka-sasl-password-file", pass}
	runBackground(t, "engine simulator up", append([]string{"engine-sim", "--addr", "127.0.0.1:0", "--name", "pod-cli", "--region", "cli",
		"--kafka-brokers", addr, "--tls-cert", cert, "--tls-key", key, "--time-scale", "0.01"}, security...)...)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	app := newApp()
	var out bytes.Buffer
	app.Writer = &out
	if err := app.RunContext(ctx, append([]string{"meridian", "events", "tail", "--kafka", addr, "--topic", "meridian.kv-events.cli",
		"--from-beginning", "--max", "1"}, security...)); err != nil {
		t.Fatalf("events tail: %v", err)
	}
	if !strings.Contains(out.String(), `"pod-cli"`) || !strings.Contains(out.String(), `https://127.0.0.1:`) {
		t.Fatalf("events tail printed %s: want the pod's PodUp with its https endpoint", out.String())
	}
}

// TestKafkaCLISecureByDefault: every command that talks to Kafka refuses a
// plaintext broker beyond loopback unless --kafka-insecure, and kv-bridge
// --check shows the kafka section the flags make, naming the password's
// file and never the password.
func TestKafkaCLISecureByDefault(t *testing.T) {
	pass := filepath.Join(t.TempDir(), "p")
	if err := os.WriteFile(pass, []byte("never-printed-5e1c"), 0o600); err != nil {
		t.Fatal(err)
	}
	const far = "kafka.example:9092"
	const want = "kafka.brokers kafka.example:9092: not loopback and kafka.tls is not set"
	for _, args := range [][]string{
		{"kv-bridge", "--kafka", far, "--region", "r", "--pod", "a=tcp://10.0.0.7:5557", "--check"},
		{"engine-sim", "--addr", "127.0.0.1:0", "--region", "r", "--kafka-brokers", far},
		{"events", "tail", "--kafka", far, "--topic", "t"},
	} {
		_, _, err := runApp(t, args...)
		if err == nil || !strings.Contains(err.Error(), want) || exitCode(err) != 2 {
			t.Errorf("%v: %v (exit %d), want a usage error naming %q", args, err, exitCode(err), want)
		}
	}
	out, _, err := runApp(t, "kv-bridge", "--kafka", far, "--region", "r", "--pod", "a=tcp://10.0.0.7:5557", "--kafka-insecure", "--check")
	if err != nil || !strings.Contains(out, "insecure: true") {
		t.Fatalf("kv-bridge --kafka-insecure: %v\n%s", err, out)
	}
	out, _, err = runApp(t, "kv-bridge", "--kafka", "kafka.example:9093", "--region", "r", "--pod", "a=tcp://10.0.0.7:5557",
		"--kafka-ca", "/etc/kafka/ca.pem", "--kafka-sasl-mechanism", "scram-sha-256", "--kafka-sasl-user", "bridge",
		"--kafka-sasl-password-file", pass, "--check")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"ca: /etc/kafka/ca.pem", "mechanism: scram-sha-256", "username: bridge", "password_file: " + pass} {
		if !strings.Contains(out, w) {
			t.Errorf("kv-bridge --check lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "never-printed-5e1c") {
		t.Fatalf("the password is printed:\n%s", out)
	}
}
