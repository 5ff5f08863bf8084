package main

// The graceful stop of the real binary: two controller replicas of one
// region run as `meridian controller` processes (built from this package)
// with TLS from `meridian certs init`, API keys from `meridian auth keygen`,
// Raft, gossip and the audit log, on a kfake broker; one is sent SIGTERM
// while requests are in flight on it. The in-process tests
// (regional/lifecycle_test.go, scenarios/fleet) drive Controller.Shutdown
// directly; this one checks what only the process shows: the signal
// reaches it, the drain happens in that order, and it exits 0.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/regional/gossip/gossiptest"
	"github.com/meridian-llm/meridian/regional/kvevents"
)

// buildMeridian builds this package's binary into a test directory, with
// the race detector when the tests have it.
func buildMeridian(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "meridian")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, goBin, append(args, ".")...).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// waitUntil polls cond until it holds, failing the test after limit (a
// bound against a hang, not a timing assertion).
func waitUntil(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("not within %v: %s", limit, what)
		case <-tick.C:
		}
	}
}

// freeAddr returns a loopback address whose port is free for TCP and UDP
// (gossip listens on both).
func freeAddr(t *testing.T) string {
	t.Helper()
	return gossiptest.FreeAddr(t)
}

// process is a meridian process the test started.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string // its stderr and stdout
	done chan struct{}
	err  error // Wait's, once done is closed
}

func startProcess(t *testing.T, bin, name string, env []string, args ...string) *process {
	t.Helper()
	p := &process{name: name, log: filepath.Join(t.TempDir(), name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env, p.cmd.Stdout, p.cmd.Stderr = env, f, f
	if err := p.cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			t.Logf("%s's log (tail):\n%s", name, b)
		}
	})
	return p
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits for the exit within budget; it fails the
// test on another exit status than 0.
func (p *process) stop(t *testing.T, budget time.Duration) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.waitExit(t, budget)
}

func (p *process) waitExit(t *testing.T, budget time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(budget):
		t.Fatalf("%s did not exit within its shutdown budget %v", p.name, budget)
	}
	if p.err != nil {
		t.Errorf("%s exited: %v (want status 0)", p.name, p.err)
	}
}

// sigtermPod is an inference pod: it answers a chat request at once, or,
// when the request's id starts with "hold-", once release is closed. It
// records the ids of the requests that reached it.
type sigtermPod struct {
	release   chan struct{}
	held      chan string
	cancelled atomic.Int32
	mu        sync.Mutex
	seen      map[string]bool
}

var requestIDRe = regexp.MustCompile(`req-[a-z]+-[0-9]+`)

func (p *sigtermPod) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	id := string(requestIDRe.Find(body))
	p.mu.Lock()
	p.seen[id] = true
	p.mu.Unlock()
	if strings.HasPrefix(id, "req-hold-") {
		p.held <- id
		select {
		case <-p.release:
		case <-r.Context().Done():
			p.cancelled.Add(1)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"choices":[{"message":{"content":"ok %s"}}],"usage":{"prompt_tokens":3}}`, id)
}

func (p *sigtermPod) reached(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[id]
}

// answer is what a client got for one request.
type answer struct {
	id     string
	status int
	body   string
	err    error
}

// chatClient sends authenticated chat requests over https.
type chatClient struct {
	hc  *http.Client
	key string
}

func (c *chatClient) chat(url, id string) answer {
	body, _ := json.Marshal(map[string]any{"model": "default", "max_tokens": 2,
		"messages": []map[string]string{{"role": "user", "content": id + ": say ok"}}})
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.key)
	resp, err := c.hc.Do(req)
	if err != nil {
		return answer{id: id, err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{id: id, status: resp.StatusCode, body: string(b), err: err}
}

// stream sends one request every tick to url until stopped.
type stream struct {
	mu      sync.Mutex
	answers []answer
	stop    chan struct{}
	done    chan struct{}
}

func startStream(c *chatClient, url, name string) *stream {
	s := &stream{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			a := c.chat(url, fmt.Sprintf("req-%s-%d", name, i))
			s.mu.Lock()
			s.answers = append(s.answers, a)
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *stream) halt() []answer {
	close(s.stop)
	<-s.done
	return s.snapshot()
}

func (s *stream) snapshot() []answer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]answer(nil), s.answers...)
}

func (s *stream) served() int {
	n := 0
	for _, a := range s.snapshot() {
		if a.err == nil && a.status == http.StatusOK {
			n++
		}
	}
	return n
}

// readyz answers what GET url/readyz gave: its status, or 0 when no
// answer came (refused, reset: the listener is gone).
func readyz(hc *http.Client, url string) (int, map[string]any) {
	resp, err := hc.Get(url + "/readyz")
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	var detail map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&detail)
	return resp.StatusCode, detail
}

// TestControllerSIGTERMDrainsReplica: SIGTERM to a serving replica of the
// real binary, with requests in flight on it and traffic on both
// replicas. Its /readyz turns 503 while it still serves (on the admin
// listener, which stays up through the drain; on the API listener the
// answers go 200, then 503, then none, never back); then its API listener
// refuses new connections (no new request is accepted: none that failed
// reached the pod); the requests in flight finish with their answers and
// none was cancelled; it exits 0 within its shutdown budget. Meanwhile
// every request to the other replica is served, before, during and after.
// No sleeps: every wait is on an observable state, bounded.
func TestControllerSIGTERMDrainsReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs two controllers")
	}
	bin := buildMeridian(t)
	dir := t.TempDir()
	const region = "us-east-1"
	ids := []string{"ctl-us-east-1-1", "ctl-us-east-1-2"}

	// The binary's own PKI and API key.
	run := func(args ...string) string {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("meridian %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	pki := filepath.Join(dir, "pki")
	run("certs", "init", "--dir", pki, "--regions", region, "--replicas", "2")
	gen := run("auth", "keygen", "--name", "sigterm", "--tenant", "acme", "--data-classes", "public", "--default-data-class", "public")
	key := regexp.MustCompile(`(?m)^key: (\S+)$`).FindStringSubmatch(gen)
	_, entry, ok := strings.Cut(gen, "# keys file entry (the key itself goes to the client only):\n")
	if key == nil || !ok {
		t.Fatalf("auth keygen printed:\n%s", gen)
	}
	keysFile := filepath.Join(dir, "api-keys.yaml")
	policyFile := filepath.Join(dir, "policy.yaml")
	for f, body := range map[string]string{
		keysFile:   "keys:\n" + entry,
		policyFile: "version: 1\nrevision: sigterm\nregions: [us-east-1]\nzones:\n  us: [us-east-1]\ndefault:\n  allow: [origin]\n",
	} {
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ca, err := os.ReadFile(filepath.Join(pki, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	tlsc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	// Clients: the held requests and the stream to the replica that stops
	// open a connection each (whether a request was accepted is then a
	// matter of its own connection); the stream to the other replica
	// keeps its connections, as a load balancer does.
	fresh := func() *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: tlsc, DisableKeepAlives: true}, Timeout: 3 * time.Minute}
	}
	kept := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsc}, Timeout: 3 * time.Minute}
	defer kept.CloseIdleConnections()
	probe := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsc, DisableKeepAlives: true}, Timeout: 10 * time.Second}

	// The region's topic on a Kafka-protocol broker, and its pod.
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, kvevents.TopicFor(region)))
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	pod := &sigtermPod{release: make(chan struct{}), held: make(chan string, 16), seen: map[string]bool{}}
	podSrv := httptest.NewServer(pod)
	defer podSrv.Close()
	released := false
	defer func() {
		if !released {
			close(pod.release)
		}
	}()

	// Two replicas from one configuration each, as a StatefulSet's pods:
	// the first bootstraps Raft (bootstrap_id), the second joins it.
	type replica struct {
		id, api, admin, raft, gossip string
		p                            *process
	}
	reps := make([]*replica, 2)
	for i, id := range ids {
		reps[i] = &replica{id: id, api: freeAddr(t), admin: freeAddr(t), raft: freeAddr(t), gossip: freeAddr(t)}
	}
	const drainDelay, grace = time.Second, 60 * time.Second
	// Shutdown's budget: the drain delay, the grace, and 15 s for the rest
	// (gossip leave, audit seal, Raft leadership transfer).
	budget := drainDelay + grace + 15*time.Second
	env := []string{"MERIDIAN_ADMIN_TOKEN=sigterm-test-admin-token-of-32-bytes",
		"MERIDIAN_GOSSIP_KEY=" + base64.StdEncoding.EncodeToString([]byte("sigterm-test-gossip-key-32-bytes")),
		"MERIDIAN_AUDIT_KEY=sigterm-test-audit-hmac-key-of-32-bytes"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MERIDIAN_") {
			env = append(env, kv)
		}
	}
	for i, r := range reps {
		gossipJoin := "[]"
		if i > 0 {
			gossipJoin = "[" + reps[0].gossip + "]"
		}
		cfg := fmt.Sprintf(`region: %[1]s
controller_id: %[2]s
listen: %[3]s
admin_listen: %[4]s
tls: {cert: %[5]s/%[2]s.pem, key: %[5]s/%[2]s-key.pem, client_ca: %[5]s/ca.pem}
auth: {mode: api_keys, api_keys: {file: %[6]s}}
policy_file: %[7]s
kafka: {brokers: [%[8]s]}
pods:
  static: [{name: pod-1, endpoint: %[9]s, profile: h100}]
raft: {data_dir: %[10]s/raft, bind: %[11]s, bootstrap_id: %[12]s, join: ["https://%[13]s"], voters: 3, election_timeout: 2s}
gossip: {bind: %[14]s, join: %[15]s, fast: true}
audit: {dir: %[16]s/audit}
shutdown: {drain_delay: %[17]v, grace: %[18]v}
`, region, r.id, r.api, r.admin, pki, keysFile, policyFile, broker.ListenAddrs()[0], podSrv.URL,
			filepath.Join(dir, r.id), r.raft, ids[0], reps[0].admin, r.gossip, gossipJoin, dir, drainDelay, grace)
		file := filepath.Join(dir, r.id+".yaml")
		if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		r.p = startProcess(t, bin, r.id, env, "controller", "--config", file, "--log-format", "json")
		url := "https://" + r.api
		waitUntil(t, 3*time.Minute, r.id+" ready", func() bool {
			if r.p.exited() {
				t.Fatalf("%s exited at start: %v", r.id, r.p.err)
			}
			s, _ := readyz(probe, url)
			return s == http.StatusOK
		})
	}
	a, b := reps[0], reps[1] // a bootstrapped Raft and leads it: it is stopped
	aURL, bURL := "https://"+a.api, "https://"+b.api
	cc := &chatClient{hc: fresh(), key: key[1]}
	ck := &chatClient{hc: kept, key: key[1]}
	for _, url := range []string{aURL, bURL} {
		if got := cc.chat(url, "req-warmup-0"); got.err != nil || got.status != http.StatusOK {
			t.Fatalf("a request to %s before the stop: %+v", url, got)
		}
	}

	// /readyz on a's API listener, watched throughout.
	var rmu sync.Mutex
	var readies []int
	watchStop, watchDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchDone)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-watchStop:
				return
			case <-tick.C:
			}
			s, _ := readyz(probe, aURL)
			rmu.Lock()
			if len(readies) == 0 || readies[len(readies)-1] != s {
				readies = append(readies, s)
			}
			rmu.Unlock()
			if s == 0 {
				return // the listener is gone: it stays gone
			}
		}
	}()
	defer func() {
		select {
		case <-watchDone:
		default:
			close(watchStop)
			<-watchDone
		}
	}()

	// Traffic on both replicas; then requests held in flight on a.
	sa, sb := startStream(&chatClient{hc: fresh(), key: key[1]}, aURL, "a"), startStream(ck, bURL, "b")
	waitUntil(t, 2*time.Minute, "traffic served by both replicas", func() bool { return sa.served() >= 5 && sb.served() >= 5 })
	const inFlight = 3
	held := make(chan answer, inFlight)
	for i := range inFlight {
		go func() { held <- cc.chat(aURL, fmt.Sprintf("req-hold-%d", i)) }()
	}
	for range inFlight {
		select {
		case <-pod.held:
		case <-time.After(2 * time.Minute):
			t.Fatal("the held requests did not reach the pod")
		}
	}

	// SIGTERM.
	if err := a.p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	adminURL := "https://" + a.admin
	waitUntil(t, time.Minute, "a's /readyz 503 draining while its requests are in flight", func() bool {
		if a.p.exited() {
			t.Fatalf("a exited on SIGTERM with requests in flight, without draining: %v", a.p.err)
		}
		s, d := readyz(probe, adminURL)
		return s == http.StatusServiceUnavailable && d["draining"] == true
	})
	waitUntil(t, time.Minute, "a's API listener refusing new connections", func() bool {
		_, err := probe.Get(aURL + "/healthz")
		return errors.Is(err, syscall.ECONNREFUSED)
	})
	// Drained: no new request is accepted, while the ones in flight are
	// still held and a still runs.
	var refused []string
	for i := range 5 {
		id := fmt.Sprintf("req-late-%d", i)
		if got := cc.chat(aURL, id); !errors.Is(got.err, syscall.ECONNREFUSED) {
			t.Errorf("a request to a after its drain: %+v, want connection refused", got)
		}
		refused = append(refused, id)
	}
	select {
	case got := <-held:
		t.Fatalf("a request in flight was answered before the pod answered it: %+v", got)
	default:
	}
	if a.p.exited() {
		t.Fatalf("a exited with requests in flight: %v", a.p.err)
	}
	streamA := sa.halt()

	// The pod answers: the requests in flight finish, and a exits 0.
	close(pod.release)
	released = true
	for range inFlight {
		got := <-held
		if got.err != nil || got.status != http.StatusOK || !strings.Contains(got.body, "ok "+got.id) {
			t.Errorf("a request in flight on a at SIGTERM: %+v", got)
		}
	}
	a.p.waitExit(t, budget)
	if n := pod.cancelled.Load(); n != 0 {
		t.Errorf("%d requests in flight were cancelled at the pod", n)
	}
	close(watchStop)
	<-watchDone

	// b served throughout, and still does with a gone.
	after := sb.served()
	waitUntil(t, time.Minute, "b serving after a exited", func() bool { return sb.served() >= after+5 })
	streamB := sb.halt()

	// What a's API listener answered /readyz: 200, then 503 (the drain
	// delay), then nothing; never ready again once it was not.
	rmu.Lock()
	seq := append([]int(nil), readies...)
	rmu.Unlock()
	rank := map[int]int{http.StatusOK: 0, http.StatusServiceUnavailable: 1, 0: 2}
	for i, s := range seq {
		if r, ok := rank[s]; !ok || (i > 0 && r < rank[seq[i-1]]) {
			t.Errorf("a's /readyz answered %v: want 200, then 503, then no answer, in that order", seq)
			break
		}
	}
	if len(seq) == 0 || seq[0] != http.StatusOK || seq[len(seq)-1] != 0 {
		t.Errorf("a's /readyz answered %v: want from 200 to no answer", seq)
	}
	// Every request to a was answered 200, or failed without reaching the
	// pod (not accepted); none accepted was lost.
	servedA, notAccepted := 0, 0
	for _, got := range streamA {
		switch {
		case got.err == nil && got.status == http.StatusOK:
			servedA++
		case got.err != nil && !pod.reached(got.id):
			notAccepted++
		default:
			t.Errorf("a request to a during its stop: %+v (reached the pod: %v)", got, pod.reached(got.id))
		}
	}
	for _, id := range refused {
		if pod.reached(id) {
			t.Errorf("%s, sent after a's drain, reached the pod", id)
		}
	}
	servedB := 0
	for _, got := range streamB {
		if got.err != nil || got.status != http.StatusOK {
			t.Errorf("a request to b: %+v", got)
			continue
		}
		servedB++
	}
	logA, _ := os.ReadFile(a.p.log)
	for _, want := range []string{"shutting down: not ready, draining", "global node closed"} {
		if !bytes.Contains(logA, []byte(want)) {
			t.Errorf("a's log lacks %q", want)
		}
	}
	t.Logf("a (%s): /readyz on its API %v; %d requests served, %d not accepted after the drain, %d in flight finished; b (%s): %d served, 0 failed",
		a.id, seq, servedA, notAccepted+len(refused), inFlight, b.id, servedB)

	// b, the region's last replica, stops as cleanly with its Raft quorum
	// gone.
	b.p.stop(t, budget)
	sc := bufio.NewScanner(bytes.NewReader(logA))
	for sc.Scan() {
		if bytes.Contains(sc.Bytes(), []byte(`"level":"ERROR"`)) {
			t.Logf("a logged an error: %s", sc.Text())
		}
	}
}
