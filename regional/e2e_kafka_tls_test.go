package regional_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/kafkasec"
	"github.com/meridian-llm/meridian/regional/kafkasec/kafkasectest"
	"github.com/meridian-llm/meridian/regional/route"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

type lockedBuffer = regional.LockedBuffer

// openKafkaController opens a controller on loopback that consumes brokers
// with sec; mut adjusts the rest. Logs go to the returned buffer.
func openKafkaController(t *testing.T, brokers []string, sec kafkasec.Config, mut func(*regional.Config)) (*regional.Controller, *lockedBuffer) {
	t.Helper()
	cfg := regional.DefaultConfig()
	cfg.Region, cfg.ControllerID, cfg.Listen, cfg.AdminListen = "test", "ctl-1", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Kafka.Brokers, cfg.Kafka.Security = brokers, sec
	cfg.Kafka.ProbeInterval = 50 * time.Millisecond
	cfg.Models = []regional.ModelConfig{{Name: simModel, Tokenizer: enginesim.DefaultConfig().Tokenizer}}
	// Each scrape must finish within one interval, TLS handshake included
	// (slow under -race on a busy machine).
	cfg.ScrapeInterval = 500 * time.Millisecond
	if mut != nil {
		mut(&cfg)
	}
	logs := &lockedBuffer{}
	ctl, err := regional.Open(context.Background(), cfg, regional.Deps{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ctl.Close(ctx); err != nil {
			t.Errorf("controller close: %v", err)
		}
	})
	return ctl, logs
}

// eventually checks cond every 20ms until it holds or 30s pass: the
// controller's probes and scrapes run on their own schedule.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// get returns the status and body of url.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// readyIngest is the ingest part of /readyz.
type readyIngest struct {
	Connected bool   `json:"connected"`
	CaughtUp  bool   `json:"caught_up"`
	Kafka     string `json:"kafka"`
	Error     string `json:"error"`
}

func readyz(t *testing.T, ctl *regional.Controller) (int, readyIngest) {
	t.Helper()
	status, body := get(t, ctl.URL()+"/readyz")
	var r struct {
		Detail struct {
			Ingest readyIngest `json:"ingest"`
		} `json:"detail"`
		Ingest readyIngest `json:"ingest"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("readyz %q: %v", body, err)
	}
	if r.Ingest == (readyIngest{}) {
		r.Ingest = r.Detail.Ingest
	}
	return status, r.Ingest
}

// labelled is the value of one labelled sample on /metrics (0: absent).
func labelled(t *testing.T, url, sample string) float64 {
	t.Helper()
	_, body := get(t, url+"/metrics")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}

// TestKafkaIngestOverTLSAndSCRAM, end to end on loopback: engine
// simulators publish over TLS and SCRAM-SHA-256 to a broker that accepts
// nothing else, the controller consumes over TLS and SCRAM with the same
// CA, becomes ready, and its index holds exactly what the engines hold
// after traffic proxied to them over https (their certificates checked
// against pods.tls.ca) — while nothing it logs or exports holds the
// password.
func TestKafkaIngestOverTLSAndSCRAM(t *testing.T) {
	b := kafkasectest.Start(t, kafkasectest.Options{})
	var engines []*enginesim.Engine
	for i := range 2 {
		cfg := enginesim.DefaultConfig()
		cfg.Name, cfg.Region, cfg.HashSeed = fmt.Sprintf("pod-%d", i), "test", "tls"
		cfg.TimeScale, cfg.CacheBlocks, cfg.DefaultMaxTokens = 0.01, 400, 2
		cfg.TLSCert, cfg.TLSKey = b.PKI.Controllers[0].Cert, b.PKI.Controllers[0].Key
		cfg.Kafka = &enginesim.KafkaConfig{Brokers: b.Addrs, Security: b.Config}
		e, err := enginesim.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, e)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = e.Close(ctx)
		})
	}
	ctl, logs := openKafkaController(t, b.Addrs, b.Config, func(c *regional.Config) {
		c.Pods.TLS = &identity.ClientTLSConfig{CA: b.PKI.CACert}
		c.Pods.RequireHTTPS = true
	})
	if err := ctl.Ingester.WaitFor(context.Background(), func() bool {
		n := 0
		for _, p := range ctl.Registry.Pods() {
			if strings.HasPrefix(p.Info().Endpoint, "https://") {
				n++
			}
		}
		return n == len(engines)
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready", func() bool { status, _ := readyz(t, ctl); return status == http.StatusOK })
	if _, r := readyz(t, ctl); !r.Connected || r.Kafka != "tls+scram-sha-256 as meridian-test" || r.Error != "" {
		t.Fatalf("readyz ingest: %+v", r)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 24 {
		msgs := []chatMsg{{"system", fmt.Sprintf("shared system prompt %d ", i%3) + strings.Repeat("lorem ipsum dolor ", 40)}, {"user", fmt.Sprint("question ", i)}}
		if r := chat(ctx, ctl.URL(), msgs, "", ""); r.err != nil {
			t.Fatalf("request %d through the controller to an https pod: %v", i, r.err)
		}
	}
	if err := ctl.Ingester.WaitFor(ctx, func() bool { return indexMatches(ctl.Index, ctl.Registry, engines) == nil }); err != nil {
		t.Fatalf("index never matched the engines: %v", indexMatches(ctl.Index, ctl.Registry, engines))
	}
	// The https pods are scraped with the CA, without a failure.
	eventually(t, "the https pods scraped", func() bool { return metricValue(t, ctl.URL(), "meridian_scrapes_total") >= 2*float64(len(engines)) })
	if v := metricValue(t, ctl.URL(), "meridian_ingest_connected"); v != 1 {
		t.Fatalf("meridian_ingest_connected = %v", v)
	}
	for _, reason := range []string{"tls", "connect", "http_status", "parse"} {
		if n := labelled(t, ctl.URL(), `meridian_scrape_errors_total{reason="`+reason+`"}`); n != 0 {
			t.Fatalf("%v scrape errors (%s) with a trusted CA", n, reason)
		}
	}
	_, metrics := get(t, ctl.URL()+"/metrics")
	_, ready := get(t, ctl.URL()+"/readyz")
	for what, text := range map[string]string{"logs": logs.String(), "metrics": metrics, "readyz": ready} {
		if strings.Contains(text, kafkasectest.Password) {
			t.Fatalf("the Kafka password is in the controller's %s", what)
		}
	}
}

// TestKafkaIngestRefused: a wrong password, and a broker whose certificate
// another CA signed, leave the controller not ready and not connected, with
// /readyz and the log saying what to check, the failure counted by kind,
// and the password nowhere.
func TestKafkaIngestRefused(t *testing.T) {
	good := kafkasectest.Start(t, kafkasectest.Options{})
	foreign := kafkasectest.Start(t, kafkasectest.Options{ForeignCert: true})
	for _, c := range []struct {
		name    string
		brokers []string
		sec     kafkasec.Config
		kind    string
		want    string // in /readyz
		log     string // in the log
	}{
		{"wrong password", good.Addrs, good.WrongPassword(t), kafkasec.KindAuth,
			`kafka sasl: the brokers refused scram-sha-256 as "meridian-test": check kafka.sasl.username and the password (password_file`,
			`kafka sasl: the brokers refused scram-sha-256 as \"meridian-test\": check kafka.sasl.username`},
		{"broker certificate of another CA", foreign.Addrs, foreign.Config, kafkasec.KindTLS,
			"kafka tls: the broker's certificate is not signed by a CA in kafka.tls.ca",
			"kafka tls: the broker's certificate is not signed by a CA in kafka.tls.ca"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctl, logs := openKafkaController(t, c.brokers, c.sec, nil)
			t.Cleanup(func() {
				if t.Failed() {
					t.Log(logs.String())
				}
			})
			sample := fmt.Sprintf(`meridian_ingest_broker_errors_total{kind=%q}`, c.kind)
			eventually(t, sample, func() bool { return labelled(t, ctl.URL(), sample) >= 1 })
			status, r := readyz(t, ctl)
			if status != http.StatusServiceUnavailable || r.Connected || r.CaughtUp || !strings.Contains(r.Error, c.want) {
				t.Fatalf("readyz %d %+v, want 503, not connected, error %q", status, r, c.want)
			}
			if v := metricValue(t, ctl.URL(), "meridian_ingest_connected"); v != 0 {
				t.Fatalf("meridian_ingest_connected = %v", v)
			}
			eventually(t, "the explained error in the log", func() bool { return strings.Contains(logs.String(), c.log) })
			_, metrics := get(t, ctl.URL()+"/metrics")
			if strings.Contains(logs.String()+metrics, kafkasectest.Password) {
				t.Fatal("the Kafka password is in the controller's logs or metrics")
			}
		})
	}
}

// TestKafkaScrapeHTTPSPods: pods serving https are scraped with pods.tls.ca
// (the trusted pod's KV usage, held up by a long request in progress, is
// read); a pod whose certificate another CA signed is not scraped (its
// usage stays unknown though a request holds its cache too) and each
// failure is counted as a TLS scrape error.
func TestKafkaScrapeHTTPSPods(t *testing.T) {
	b := kafkasectest.Start(t, kafkasectest.Options{})
	other, err := identity.InitDevPKI(t.TempDir(), []string{"other"}, identity.PKIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The test's own client trusts both CAs: it only loads the pods.
	anyServer, err := (&identity.ClientTLSConfig{InsecureSkipVerify: true}).Load("test")
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: anyServer}
	t.Cleanup(tr.CloseIdleConnections)
	open := func(name string, cert identity.IssuedCert) *enginesim.Engine {
		cfg := enginesim.DefaultConfig()
		cfg.Name, cfg.HashSeed = name, "scrape"
		cfg.TLSCert, cfg.TLSKey = cert.Cert, cert.Key
		e, err := enginesim.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = e.Close(ctx)
		})
		// A request that decodes for minutes holds its blocks: the pod's
		// KV usage is above zero until the test ends it.
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		t.Cleanup(func() { cancel(); <-done })
		go func() {
			defer close(done)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/completions", strings.NewReader(
				`{"model": "`+simModel+`", "stream": true, "max_tokens": 100000, "prompt": "`+strings.Repeat("hold the cache ", 50)+`"}`))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := (&http.Client{Transport: tr}).Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		eventually(t, name+" holding blocks", func() bool { return e.Stats().KVUsage > 0 })
		return e
	}
	trusted, untrusted := open("trusted", b.PKI.Controllers[0]), open("untrusted", other.Controllers[0])
	ctl, logs := openKafkaController(t, b.Addrs, b.Config, func(c *regional.Config) {
		c.Pods.TLS = &identity.ClientTLSConfig{CA: b.PKI.CACert}
		c.Pods.Static = []route.PodInfo{{Name: "trusted", Endpoint: trusted.URL(), Model: simModel},
			{Name: "untrusted", Endpoint: untrusted.URL(), Model: simModel}}
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	pod := func(name string) *route.Pod {
		p, ok := ctl.Registry.Get(name)
		if !ok {
			t.Fatalf("pod %s not registered", name)
		}
		return p
	}
	eventually(t, "the trusted pod's KV usage scraped over https", func() bool { return pod("trusted").Load().KVUtil > 0 })
	eventually(t, "TLS scrape errors counted", func() bool {
		return labelled(t, ctl.URL(), `meridian_scrape_errors_total{reason="tls"}`) >= 2
	})
	if u := pod("untrusted").Load().KVUtil; u != 0 {
		t.Fatalf("the untrusted pod's KV usage %v was read", u)
	}
}
