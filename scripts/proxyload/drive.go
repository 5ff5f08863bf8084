package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

type targets []string

func (t *targets) String() string     { return strings.Join(*t, ",") }
func (t *targets) Set(v string) error { *t = append(*t, v); return nil }

// result is one JSON line of drive's output. Latencies are microseconds;
// the *_ci95_us pairs are bootstrap 95% confidence intervals.
type result struct {
	Proxy      string     `json:"proxy"`
	RPS        float64    `json:"rps"` // offered through the proxy; the direct arm gets direct_rps more
	AddedP50us float64    `json:"added_p50_us"`
	AddedP99us float64    `json:"added_p99_us"`
	MaxRPS     float64    `json:"max_rps"`
	AddedP50CI [2]float64 `json:"added_p50_ci95_us"`
	AddedP99CI [2]float64 `json:"added_p99_ci95_us"`
	Verdict    verdict    `json:"verdict"` // of added p99 <= max_added_us at rps
	// Of the window(s) at rps.
	DirectRPS     float64            `json:"direct_rps"`
	Samples       int                `json:"samples"` // through the proxy
	DirectSamples int                `json:"direct_samples"`
	LateShare     float64            `json:"late_share"`        // taken up > 1 ms after due by the pacer (judged: -max-late)
	WorkerLate    float64            `json:"worker_late_share"` // written > 1 ms after taken up (not judged)
	QueuedShare   float64            `json:"queued_share"`      // waited for a free connection
	Failed        int                `json:"failed"`            // failed or unfinished requests, both arms (counted as infinitely slow)
	GenCPU        float64            `json:"gen_cpu_cores"`
	GenCPUperReq  float64            `json:"gen_cpu_us_per_req"`
	CPU           map[string]float64 `json:"cpu_cores"` // the generator's and each -procs group's
	P50us         float64            `json:"p50_us"`
	P99us         float64            `json:"p99_us"`
	DirectP50us   float64            `json:"direct_p50_us"`
	DirectP99us   float64            `json:"direct_p99_us"`
	// Of the highest rate passed.
	AtMaxAdded99   float64            `json:"added_p99_us_at_max"`
	AtMaxCI        [2]float64         `json:"added_p99_ci95_us_at_max"`
	AtMaxLate      float64            `json:"late_share_at_max"`
	AtMaxWorker    float64            `json:"worker_late_share_at_max"`
	AtMaxSamples   int                `json:"samples_at_max"`
	AtMaxGenCPU    float64            `json:"gen_cpu_cores_at_max"`
	AtMaxCPU       map[string]float64 `json:"cpu_cores_at_max"`
	MaxAddedUS     float64            `json:"max_added_us"`
	LowestNotPass  float64            `json:"lowest_rps_not_passed"`
	LowestNotPassV verdict            `json:"lowest_not_passed_verdict"`
	Search         []stepJSON         `json:"search"`
	Stream         bool               `json:"stream"`
	Load           string             `json:"load"`
}

// stepJSON is one rate tried.
type stepJSON struct {
	RPS        float64            `json:"rps"`
	Verdict    verdict            `json:"verdict"`
	AddedP50us float64            `json:"added_p50_us"`
	AddedP99us float64            `json:"added_p99_us"`
	AddedP99CI [2]float64         `json:"added_p99_ci95_us"`
	Samples    int                `json:"samples"`
	Direct     int                `json:"direct_samples"`
	Windows    int                `json:"windows"`
	LateShare  float64            `json:"late_share"`
	WorkerLate float64            `json:"worker_late_share"`
	GenCPU     float64            `json:"gen_cpu_cores"`
	CPU        map[string]float64 `json:"cpu_cores"`
	Load       string             `json:"load"`
}

func (d *driver) toJSON(s step) stepJSON {
	return stepJSON{RPS: s.rate, Verdict: s.verdict, AddedP50us: r1(s.est.p50), AddedP99us: r1(s.est.p99), AddedP99CI: r2(s.est.p99CI),
		Samples: len(s.win.proxied), Direct: len(s.win.direct), Windows: s.windows, LateShare: s.win.lateShare(),
		WorkerLate: s.win.workerLateShare(),
		GenCPU:     perSec(s.win.genCPU, s.win.wall), CPU: d.cpu(s.win), Load: loadavg()}
}

// cpu is the cores used in w by the generator and each -procs group.
func (d *driver) cpu(w window) map[string]float64 {
	m := map[string]float64{"generator": perSec(w.genCPU, w.wall)}
	for i, p := range d.procs {
		if i < len(w.procCPU) {
			m[p.name] = perSec(w.procCPU[i], w.wall)
		}
	}
	return m
}

func drive(args []string) error {
	fs := flag.NewFlagSet("drive", flag.ExitOnError)
	direct := fs.String("direct", "", "URL of the backend's chat endpoint (required)")
	var tgts targets
	fs.Var(&tgts, "target", "NAME=URL of a proxy's chat endpoint (repeat)")
	rate := fs.Float64("rate", 1000, "requests per second through the proxy of the fixed-rate measurement, where the search starts")
	ratio := fs.Float64("direct-ratio", 0.5, "requests straight to the backend per request through the proxy")
	samples := fs.Int("samples", 20000, "requests per arm in a window (the smaller arm)")
	maxWindow := fs.Duration("max-window", 60*time.Second, "longest window: below this rate arms get fewer samples (and a wider CI)")
	maxAdded := fs.Duration("max-added", time.Millisecond, "p99 added that still counts as sustained")
	maxLate := fs.Float64("max-late", 0.01, "share of requests the pacer took up over 1 ms after due above which a window is invalid (the delay from then to writing one is reported, not judged)")
	tries := fs.Int("tries", 3, "windows per rate at most, pooled while the CI straddles -max-added")
	resamples := fs.Int("resamples", 1000, "bootstrap resamples")
	maxRate := fs.Float64("max-rate", 40000, "highest rate tried")
	minRate := fs.Float64("min-rate", 250, "lowest rate tried when -rate does not pass")
	bisections := fs.Int("bisections", 3, "halvings of the gap between the highest rate passed and the lowest not passed")
	warmup := fs.Duration("warmup", time.Second, "unmeasured load at each rate before its window")
	stream := fs.Bool("stream", false, "ask for streamed answers")
	header := fs.String("header", "", "NAME:VALUE header sent to the targets (not the backend)")
	cacert := fs.String("cacert", "", "PEM file of the CA that https targets' certificates chain to")
	conns := fs.Int("conns", 128, "kept-alive connections per arm (each with a reader goroutine)")
	var ps procs
	fs.Var(&ps, "procs", "NAME=PID[,PID...]: processes whose CPU each window reports (repeat)")
	cpuprofile := fs.String("cpuprofile", "", "write the generator's CPU profile to this file")
	block := fs.Duration("block", 500*time.Millisecond, "length of the rounds a window's intervals resample (0: resample single requests, as before: too narrow when stalls slow runs of requests)")
	alternate := fs.Duration("alternate", 0, "compare the targets at -rate instead of searching each: one run whose proxied arm goes to each target in turn for this long (see compare)")
	sliceWarm := fs.Duration("slice-warmup", 250*time.Millisecond, "with -alternate, the unmeasured start of each slice")
	_ = fs.Parse(args)
	if *direct == "" || len(tgts) == 0 {
		return errors.New("drive: -direct and at least one -target are required")
	}
	// A P for the pacer to hold while it sleeps (see sleep), beside one
	// per core for the readers.
	runtime.GOMAXPROCS(runtime.NumCPU() + 1)
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	d := &driver{body: chatBody(*stream), procs: ps, block: *block}
	if *cacert != "" {
		pem, err := os.ReadFile(*cacert)
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("%s: no certificate", *cacert)
		}
		d.tls = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if *header != "" {
		k, v, ok := strings.Cut(*header, ":")
		if !ok {
			return fmt.Errorf("-header %q: want NAME:VALUE", *header)
		}
		d.hdrKey, d.hdrVal = strings.TrimSpace(k), strings.TrimSpace(v)
	}
	c := criteria{limit: float64(*maxAdded) / 1e3, maxLate: *maxLate, tries: *tries, resamples: *resamples, seed: 1}
	var names, urls []string
	for _, t := range tgts {
		name, u, ok := strings.Cut(t, "=")
		if !ok {
			return fmt.Errorf("-target %q: want NAME=URL", t)
		}
		names, urls = append(names, name), append(urls, u)
	}
	if *alternate > 0 {
		if *sliceWarm >= *alternate {
			return fmt.Errorf("-slice-warmup %v leaves nothing of a -alternate %v slice to measure", *sliceWarm, *alternate)
		}
		if err := d.open(*direct, urls, *conns); err != nil {
			return err
		}
		defer d.close()
		return d.compare(names, *rate, *ratio, *samples, *maxWindow, *warmup, slicing{every: *alternate, warm: *sliceWarm}, c)
	}
	for i, name := range names {
		if err := d.open(*direct, urls[i:i+1], *conns); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		measure := func(r float64) window {
			d.window(r, *ratio, 0, *warmup)
			return d.window(r, *ratio, *samples, *maxWindow)
		}
		try := func(r float64) step {
			s := judge(r, measure, c)
			fmt.Fprintf(os.Stderr, "proxyload: %s at %.0f req/s (+%.0f direct): %s, added p50 %.0f us, p99 %.0f us [%.0f, %.0f] "+
				"(direct p50 %.0f p99 %.0f us; %d+%d samples, %d window(s), late %.2f%% (workers %.2f%%), cores %v; load %s)\n",
				name, r, r**ratio, s.verdict, s.est.p50, s.est.p99, s.est.p99CI[0], s.est.p99CI[1], s.est.directP50, s.est.directP99,
				len(s.win.proxied), len(s.win.direct), s.windows, 100*s.win.lateShare(), 100*s.win.workerLateShare(),
				d.cpu(s.win), loadavg())
			return s
		}
		fixed := try(*rate)
		best, steps := search(*rate, *minRate, *maxRate, *bisections, func(r float64) step {
			if r == fixed.rate {
				return fixed
			}
			return try(r)
		})
		d.close()
		w, e := fixed.win, fixed.est
		res := result{Proxy: name, RPS: *rate, AddedP50us: r1(e.p50), AddedP99us: r1(e.p99), MaxRPS: best.rate,
			AddedP50CI: r2(e.p50CI), AddedP99CI: r2(e.p99CI), Verdict: fixed.verdict,
			DirectRPS: *rate * *ratio, Samples: len(w.proxied), DirectSamples: len(w.direct),
			LateShare: w.lateShare(), WorkerLate: w.workerLateShare(), QueuedShare: share(w.queued, w.offered), Failed: failed(w),
			GenCPU: perSec(w.genCPU, w.wall), GenCPUperReq: r1(1e6 * w.genCPU / float64(max(w.offered, 1))),
			CPU:   d.cpu(w),
			P50us: r1(e.proxiedP50), P99us: r1(e.proxiedP99), DirectP50us: r1(e.directP50), DirectP99us: r1(e.directP99),
			MaxAddedUS: c.limit, Stream: *stream, Load: loadavg()}
		if best.rate > 0 {
			res.AtMaxAdded99, res.AtMaxCI = r1(best.est.p99), r2(best.est.p99CI)
			res.AtMaxLate, res.AtMaxSamples = best.win.lateShare(), len(best.win.proxied)
			res.AtMaxWorker = best.win.workerLateShare()
			res.AtMaxGenCPU, res.AtMaxCPU = perSec(best.win.genCPU, best.win.wall), d.cpu(best.win)
		}
		for _, s := range steps {
			res.Search = append(res.Search, d.toJSON(s))
			if s.verdict != pass && (res.LowestNotPass == 0 || s.rate < res.LowestNotPass) {
				res.LowestNotPass, res.LowestNotPassV = s.rate, s.verdict
			}
		}
		if err := printJSON(res); err != nil {
			return err
		}
	}
	return nil
}

// r1 rounds v to a tenth; an undefined or infinite v (an arm with over 1%
// of its requests failed has an infinite p99) becomes +-1e9, which JSON
// can hold.
func r1(v float64) float64 {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return finite(v)
	}
	return math.Round(v*10) / 10
}

// r2 rounds a CI as r1 does.
func r2(ci [2]float64) [2]float64 { return [2]float64{r1(ci[0]), r1(ci[1])} }

func finite(v float64) float64 {
	switch {
	case math.IsNaN(v), math.IsInf(v, 1):
		return 1e9
	case math.IsInf(v, -1):
		return -1e9
	}
	return v
}

func share(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}

func perSec(v, wall float64) float64 {
	if wall <= 0 {
		return 0
	}
	return math.Round(100*v/wall) / 100
}

func failed(w window) int {
	n := 0
	for _, v := range [][]float64{w.direct, w.proxied} {
		for _, l := range v {
			if math.IsInf(l, 1) {
				n++
			}
		}
	}
	return n
}

// driver sends the requests on fixed pools of kept-alive HTTP/1.1
// connections, one pool per arm of the same size (-conns), each request
// serialized into a reused buffer and written in one call: net/http's
// client (a reader and a writer goroutine per connection, a request built
// and its body copied anew each time) cost about 200 us of CPU per
// request, more than the proxies measured, and capped the rate the
// machine could offer any of them.
//
// The pacer writes each due request itself, on the connection of its arm
// that went idle last (as net/http's transport reuses connections: a few
// carry the load), or, when all are busy, queues it for the first to
// finish. Each connection has a reader goroutine, parked in the network
// poller until its answer arrives, which reads it, records the latency
// and writes the next queued request, if any. Before, the pacer handed
// each request over a channel to a worker goroutine that wrote it and
// waited for the answer: a second goroutine wake per request, a futex
// call per request or two (63k against 5k for 33k requests), and the
// worker's wait for a CPU between the two, which was then counted as the
// generator's lag. The CPU per request did not change measurably (about
// 40-50 us at 7,500 req/s against the backend alone, either way, on the
// shared 2-core machine): most of it is the kernel's, in context
// switches and loopback TCP.
type driver struct {
	body           func(dst []byte, n int) []byte
	hdrKey, hdrVal string
	tls            *tls.Config
	seq            atomic.Int64
	ends           []*endpoint   // by arm: direct, then each target open
	procs          procs         // whose CPU each window reports
	block          time.Duration // length of a window's rounds (see window)
	req, reqBody   []byte        // the pacer's request

	mu      sync.Mutex
	conns   []*clientConn
	idle    [][]*clientConn // by arm, the most recently used last
	queue   [][]job         // by arm, waiting for a free connection
	head    []int
	closing bool
}

type endpoint struct {
	scheme, host, path string
	proxied            bool
}

// clientConn is one kept-alive connection of one arm and what its reader
// goroutine needs. c, busy, job and deadline are guarded by the driver's
// mu; br, buf and body belong to the reader.
type clientConn struct {
	arm       int
	c         net.Conn // nil until its reader dials it again
	br        *bufio.Reader
	busy      bool      // job is in flight on it, or about to be
	job       job       // the request in flight
	deadline  time.Time // the one set on c
	wake      chan struct{}
	buf, body []byte
}

// job is request i of a window, due at due and taken up by the pacer at
// at, for arm (0 direct, 1... the targets), in a slice of target k's
// (the index of its arm less one).
type job struct {
	s       *session
	i       int
	due, at time.Time
	arm, k  int
	queued  bool
}

// session is one window's results.
type session struct {
	deadline atomic.Int64 // unix nanoseconds: requests not done by then fail
	lat      []float64    // by request; +Inf until it succeeds
	arm      []int8
	k        []int8  // by request, the target whose slice it fell in; -1 unmeasured
	round    []int32 // by request, its round of slices (sliced runs)
	// By target (k): of its slices' requests, measured or not.
	late   []int          // pacer's lag over maxLag (the pacer's own)
	wlate  []atomic.Int64 // written over maxLag after taken up
	queued []int          // (the pacer's)
	wg     sync.WaitGroup
}

func parseEndpoint(rawURL string, proxied bool) (*endpoint, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%s: want an http or https URL", rawURL)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	return &endpoint{scheme: u.Scheme, host: host, path: u.RequestURI(), proxied: proxied}, nil
}

// open dials n connections to the backend at direct and n to each target,
// checks each with one request, and starts their readers. Arm 0 is the
// backend's, arm i the target targets[i-1]'s.
func (d *driver) open(direct string, targets []string, n int) error {
	d.ends = d.ends[:0]
	for arm, u := range append([]string{direct}, targets...) {
		e, err := parseEndpoint(u, arm > 0)
		if err != nil {
			return err
		}
		d.ends = append(d.ends, e)
	}
	d.mu.Lock()
	d.closing = false
	d.idle, d.queue, d.head = make([][]*clientConn, len(d.ends)), make([][]job, len(d.ends)), make([]int, len(d.ends))
	d.mu.Unlock()
	for range n {
		for arm, e := range d.ends {
			deadline := time.Now().Add(10 * time.Second)
			cc := &clientConn{arm: arm, wake: make(chan struct{}, 1)}
			err := cc.dial(d, deadline)
			var code int
			if err == nil {
				cc.buf, cc.body = d.request(cc.buf[:0], cc.body[:0], arm)
				if _, err = cc.c.Write(cc.buf); err == nil {
					code, _, err = cc.readAnswer()
				}
			}
			if err == nil && code != 200 {
				err = fmt.Errorf("status %d", code)
			}
			d.conns = append(d.conns, cc)
			if err != nil {
				if cc.c != nil {
					cc.c.Close()
				}
				return fmt.Errorf("%s://%s%s: %w", e.scheme, e.host, e.path, err)
			}
			_ = cc.c.SetDeadline(time.Time{})
			d.mu.Lock()
			cc.deadline = time.Time{}
			d.idle[arm] = append(d.idle[arm], cc)
			d.mu.Unlock()
			go d.read(cc)
		}
	}
	return nil
}

// close stops the readers and closes the connections.
func (d *driver) close() {
	d.mu.Lock()
	d.closing = true
	for _, cc := range d.conns {
		if cc.c != nil {
			cc.c.Close()
		}
		close(cc.wake)
	}
	d.conns, d.idle, d.queue, d.head = nil, nil, nil, nil
	d.mu.Unlock()
}

// dial connects cc (with TLS for https) by deadline.
func (cc *clientConn) dial(d *driver, deadline time.Time) error {
	e := d.ends[cc.arm]
	dl := net.Dialer{Deadline: deadline}
	c, err := dl.Dial("tcp", e.host)
	if err != nil {
		return err
	}
	if e.scheme == "https" {
		cfg := d.tls.Clone()
		if cfg == nil {
			cfg = &tls.Config{}
		}
		cfg.ServerName, _, _ = net.SplitHostPort(e.host)
		tc := tls.Client(c, cfg)
		_ = tc.SetDeadline(deadline)
		if err := tc.Handshake(); err != nil {
			c.Close()
			return err
		}
		c = tc
	}
	_ = c.SetDeadline(deadline)
	if cc.br == nil {
		cc.br = bufio.NewReaderSize(c, 16<<10)
	} else {
		cc.br.Reset(c)
	}
	d.mu.Lock()
	cc.c, cc.deadline = c, deadline
	d.mu.Unlock()
	return nil
}

// request appends a request for arm to buf, its body built in body.
func (d *driver) request(buf, body []byte, arm int) (req, reqBody []byte) {
	e := d.ends[arm]
	b := append(buf, "POST "...)
	b = append(append(append(append(b, e.path...), " HTTP/1.1\r\nHost: "...), e.host...), "\r\nContent-Type: application/json\r\n"...)
	if e.proxied && d.hdrKey != "" {
		b = append(append(append(append(b, d.hdrKey...), ": "...), d.hdrVal...), "\r\n"...)
	}
	body = d.body(body, int(d.seq.Add(1)))
	b = strconv.AppendInt(append(b, "Content-Length: "...), int64(len(body)), 10)
	return append(append(b, "\r\n\r\n"...), body...), body
}

// readAnswer reads one answer to the end: its status and whether the
// connection can carry another request.
func (cc *clientConn) readAnswer() (code int, keep bool, err error) {
	for {
		line, err := cc.br.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		_, rest, _ := strings.Cut(string(line), " ")
		if len(rest) < 3 {
			return 0, false, fmt.Errorf("status line %q", line)
		}
		if code, err = strconv.Atoi(rest[:3]); err != nil {
			return 0, false, fmt.Errorf("status line %q", line)
		}
		length, chunked := int64(-1), false
		keep = true
		for {
			k, v, end, err := headerLine(cc.br)
			if err != nil {
				return code, false, err
			}
			if end {
				break
			}
			switch {
			case bytes.EqualFold(k, []byte("Content-Length")):
				if length, err = strconv.ParseInt(string(v), 10, 64); err != nil {
					return code, false, err
				}
			case bytes.EqualFold(k, []byte("Transfer-Encoding")):
				chunked = bytes.EqualFold(v, []byte("chunked"))
			case bytes.EqualFold(k, []byte("Connection")):
				keep = !bytes.EqualFold(v, []byte("close"))
			}
		}
		if code >= 100 && code < 200 {
			continue // informational: the answer follows
		}
		switch {
		case chunked:
			_, err = readRequestBody(cc.br, nil, 0, true)
			// (a chunked body, read and dropped: the same framing)
		case length >= 0:
			_, err = cc.br.Discard(int(length))
		default: // to the end of the connection
			_, err = io.Copy(io.Discard, cc.br)
			keep = false
		}
		return code, keep && err == nil, err
	}
}

// setDeadline sets j's deadline on cc's connection, unless it is set
// already (d.mu held).
func (cc *clientConn) setDeadline(j job) {
	if dl := time.Unix(0, j.s.deadline.Load()); cc.c != nil && !dl.Equal(cc.deadline) {
		_ = cc.c.SetDeadline(dl)
		cc.deadline = dl
	}
}

// dispatch hands j (due now) to the connection of its arm that went idle
// last and writes it there, or queues it when all are busy. A connection
// that was closed is dialed again by its reader, which then writes j.
func (d *driver) dispatch(j job) {
	d.mu.Lock()
	a := j.arm
	n := len(d.idle[a])
	if n == 0 || d.head[a] < len(d.queue[a]) {
		j.queued = true
		j.s.queued[j.k]++
		d.queue[a] = append(d.queue[a], j)
		d.mu.Unlock()
		return
	}
	cc := d.idle[a][n-1]
	d.idle[a] = d.idle[a][:n-1]
	cc.busy, cc.job = true, j
	cc.setDeadline(j)
	c := cc.c
	d.mu.Unlock()
	if c == nil {
		cc.wake <- struct{}{}
		return
	}
	d.req, d.reqBody = d.request(d.req[:0], d.reqBody[:0], a)
	if workerLate(j.at, time.Now(), false) {
		j.s.wlate[j.k].Add(1)
	}
	if _, err := c.Write(d.req); err != nil {
		c.Close() // its reader finds it closed and fails j
	}
}

// read is cc's reader: it reads each answer, records it, and writes the
// next queued request of its arm, or goes idle. A connection closed while
// idle (by the other end, or an idle deadline passed) is left to be
// dialed when it is next given a request.
func (d *driver) read(cc *clientConn) {
	for {
		d.mu.Lock()
		c, closing := cc.c, d.closing
		d.mu.Unlock()
		if closing {
			return
		}
		if c == nil {
			// Closed: wait for a request, then dial and write it.
			if _, ok := <-cc.wake; !ok {
				return
			}
			d.mu.Lock()
			j := cc.job
			d.mu.Unlock()
			d.write(cc, j)
			continue
		}
		code, keep, err := cc.readAnswer()
		now := time.Now()
		d.mu.Lock()
		if d.closing {
			d.mu.Unlock()
			return
		}
		if !cc.busy || errors.Is(err, os.ErrDeadlineExceeded) && now.Before(cc.deadline) {
			// Nothing was asked yet (or the deadline was moved since the
			// read began): an idle deadline passed, or the other end
			// closed the connection.
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if !cc.busy {
					_ = cc.c.SetDeadline(time.Time{})
					cc.deadline = time.Time{}
				}
			} else {
				cc.c.Close()
				cc.c = nil
			}
			d.mu.Unlock()
			continue
		}
		j := cc.job
		if err == nil && code == 200 {
			j.s.lat[j.i] = float64(now.Sub(j.due)) / 1e3
		}
		if err != nil || !keep {
			cc.c.Close()
			cc.c = nil
		}
		d.next(cc)
	}
}

// next gives cc the next queued request of its arm, if any, or puts it
// back on the idle list, and marks the request it carried done (d.mu held;
// it unlocks). A queued request whose deadline has passed is not sent: it
// counts as not completed.
func (d *driver) next(cc *clientConn) {
	done := cc.job.s
	a := cc.arm
	for d.head[a] < len(d.queue[a]) {
		j := d.queue[a][d.head[a]]
		d.head[a]++
		if time.Now().UnixNano() >= j.s.deadline.Load() {
			j.s.wg.Done()
			continue
		}
		cc.job = j
		cc.setDeadline(j)
		d.mu.Unlock()
		done.wg.Done()
		d.write(cc, j)
		return
	}
	if d.head[a] == len(d.queue[a]) {
		d.queue[a], d.head[a] = d.queue[a][:0], 0
	}
	cc.busy = false
	d.idle[a] = append(d.idle[a], cc)
	d.mu.Unlock()
	done.wg.Done()
}

// write sends j on cc from its reader, dialing first if cc is closed; if
// that fails, j fails and cc goes on.
func (d *driver) write(cc *clientConn, j job) {
	d.mu.Lock()
	c := cc.c
	d.mu.Unlock()
	var err error
	if c == nil {
		if err = cc.dial(d, time.Unix(0, j.s.deadline.Load())); err == nil {
			d.mu.Lock()
			c = cc.c
			d.mu.Unlock()
		}
	}
	if err == nil {
		cc.buf, cc.body = d.request(cc.buf[:0], cc.body[:0], j.arm)
		if workerLate(j.at, time.Now(), j.queued) {
			j.s.wlate[j.k].Add(1)
		}
		if _, err = c.Write(cc.buf); err == nil {
			return // the reader reads the answer
		}
		c.Close()
	}
	d.mu.Lock()
	cc.c = nil
	d.next(cc)
}

// window offers rate requests per second through the target and
// rate*ratio straight to the backend, on one open-loop schedule with each
// request's arm drawn at random, until each arm has samples requests or
// the window has lasted length (samples 0: for length). Requests not done
// by a grace of a second and a tenth of the window after the last was due
// count as failed.
//
// The pacer sleeps until each request is due with nanosleep: time.Sleep
// wakes up to a millisecond late (the runtime's poller waits in whole
// milliseconds), which added about 0.55 ms at p50 and 2 ms at p99 to every
// latency measured, proxied or not.
//
// With d.block set, the window's samples carry rounds of that length (see
// window.directRound), and its intervals resample them.
func (d *driver) window(rate, ratio float64, samples int, length time.Duration) window {
	return d.run(rate, ratio, samples, length, slicing{block: d.block})[0]
}

// slicing is how run shares a window among the targets open: the proxied
// arm goes to each in turn for a slice of every (a length of 0: all to
// the first), and the first warm of each slice is not measured (its
// requests are sent, and count in the slice's CPU and lateness, but
// their latencies are not samples). A round is a cycle of slices, one
// per target; without slices, block (0: no rounds).
type slicing struct{ every, warm, block time.Duration }

// round is the round of the moment elapsed into a window, of n targets;
// -1 for none.
func (sl slicing) round(elapsed time.Duration, n int) int32 {
	switch {
	case sl.every > 0:
		return int32(elapsed / (sl.every * time.Duration(n)))
	case sl.block > 0:
		return int32(elapsed / sl.block)
	}
	return -1
}

// at is the target (its index among those open, of n) whose slice holds
// the moment elapsed into a window, and whether that moment is measured.
func (sl slicing) at(elapsed time.Duration, n int) (k int, measured bool) {
	if sl.every <= 0 || n <= 1 {
		return 0, true
	}
	i := elapsed / sl.every
	return int(i % time.Duration(n)), elapsed-i*sl.every >= sl.warm
}

// run is window for every target open, sliced by sl: one window per
// target, each with its slices' samples of both arms, CPU and lateness,
// until each target's two arms have samples measured requests or the
// schedule has lasted length per target.
func (d *driver) run(rate, ratio float64, samples int, length time.Duration, sl slicing) []window {
	nt := len(d.ends) - 1
	if sl.every <= 0 {
		nt = 1 // the first target only
	}
	total := rate * (1 + ratio)
	directShare := ratio / (1 + ratio)
	n := int(math.Ceil(total * length.Seconds() * float64(nt)))
	interval := float64(time.Second) / total
	s := &session{lat: make([]float64, n), arm: make([]int8, n), k: make([]int8, n), round: make([]int32, n),
		late: make([]int, nt), wlate: make([]atomic.Int64, nt), queued: make([]int, nt)}
	for i := range s.lat {
		s.lat[i] = math.Inf(1)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(d.seq.Load())))
	out := make([]window, nt)
	// CPU and wall time are charged to the target whose slice they fell
	// in, read at each change of slice.
	cpu0, other0 := selfCPU(), procCPU(d.procs)
	charge := func(k int, since time.Time) {
		cpu, other := selfCPU(), procCPU(d.procs)
		w := &out[k]
		w.genCPU += cpu - cpu0
		w.wall += time.Since(since).Seconds()
		if w.procCPU == nil {
			w.procCPU = make([]float64, len(other))
		}
		for i := range other {
			w.procCPU[i] += other[i] - other0[i]
		}
		cpu0, other0 = cpu, other
	}
	start := time.Now().Add(time.Millisecond)
	s.deadline.Store(start.Add(time.Duration(nt)*(length+length/10) + time.Second).UnixNano())
	counts := make([][2]int, nt)
	offered := make([]int, nt)
	cur, curSince := 0, start
	done := func() bool {
		if samples <= 0 {
			return false
		}
		for _, c := range counts {
			if c[0] < samples || c[1] < samples {
				return false
			}
		}
		return true
	}
	last := 0
	for i := 0; i < n; i++ {
		if done() {
			break
		}
		due := start.Add(time.Duration(float64(i) * interval))
		if w := time.Until(due); w > 0 {
			ts := syscall.NsecToTimespec(int64(w))
			sleep(&ts)
		}
		k, measured := sl.at(due.Sub(start), nt)
		s.round[i] = sl.round(due.Sub(start), nt)
		if k != cur {
			charge(cur, curSince)
			cur, curSince = k, time.Now()
		}
		arm := 1 + k
		if rng.Float64() < directShare {
			arm = 0
		}
		s.arm[i], s.k[i] = int8(arm), -1
		if measured {
			s.k[i] = int8(k)
			counts[k][min(arm, 1)]++
		}
		s.wg.Add(1)
		offered[k]++
		last = i + 1
		at := time.Now()
		if pacerLate(due, at) {
			s.late[k]++
		}
		d.dispatch(job{s: s, i: i, due: due, at: at, arm: arm, k: k})
	}
	end := time.Now()
	if dl := end.Add(end.Sub(start)/10 + time.Second).UnixNano(); dl < s.deadline.Load() {
		s.deadline.Store(dl) // requests in flight keep the deadline they were sent with
	}
	s.wg.Wait()
	charge(cur, curSince)
	for k := range out {
		w := &out[k]
		w.offered, w.late, w.workerLate, w.queued = offered[k], s.late[k], int(s.wlate[k].Load()), s.queued[k]
	}
	for i := 0; i < last; i++ {
		k := s.k[i]
		if k < 0 {
			continue
		}
		w := &out[k]
		if s.arm[i] == 0 {
			w.direct = append(w.direct, s.lat[i])
			if s.round[i] >= 0 {
				w.directRound = append(w.directRound, s.round[i])
			}
		} else {
			w.proxied = append(w.proxied, s.lat[i])
			if s.round[i] >= 0 {
				w.proxiedRound = append(w.proxiedRound, s.round[i])
			}
		}
	}
	return out
}

// sleep sleeps for ts with nanosleep, holding on to the goroutine's P
// (a raw system call: the runtime does not know the thread is blocked).
// Through the runtime's syscall.Nanosleep, sysmon polled every 20 us to
// hand the sleeping pacer's P to another thread, and the pacer, woken,
// could wait for a P behind the reader goroutines (perf stat at 2,000
// req/s against the backend: 61k nanosleep calls and 105k context
// switches for 33k requests, against 40k and 85k).
// drive runs with one P more than the cores for the pacer to hold. The
// cost: a garbage collection's stop waits for the pacer's sleep (at most
// one interval of the schedule, 2.7 ms at -min-rate 250).
func sleep(ts *syscall.Timespec) {
	for {
		_, _, e := syscall.RawSyscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(ts)), uintptr(unsafe.Pointer(ts)), 0)
		if e != syscall.EINTR {
			return
		}
	}
}

// selfCPU is this process's CPU time so far, in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// procCPU is the CPU time so far of each named group of processes, in
// seconds (user and system of all their threads, from /proc/PID/stat in
// clock ticks of 1/100 s). /proc/stat's machine-wide figures are no use
// here: its ticks miss the short bursts of a mostly idle machine (at 1k
// req/s it showed less than the generator alone used).
func procCPU(procs []proc) []float64 {
	out := make([]float64, len(procs))
	for i, p := range procs {
		for _, pid := range p.pids {
			b, err := os.ReadFile("/proc/" + pid + "/stat")
			if err != nil {
				continue
			}
			_, rest, _ := strings.Cut(string(b), ") ") // after the command name
			f := strings.Fields(rest)
			if len(f) < 13 {
				continue
			}
			ut, _ := strconv.ParseFloat(f[11], 64)
			st, _ := strconv.ParseFloat(f[12], 64)
			out[i] += (ut + st) / 100
		}
	}
	return out
}

// proc is a named group of processes whose CPU the windows report.
type proc struct {
	name string
	pids []string
}

type procs []proc

func (p *procs) String() string { return fmt.Sprint(*p) }
func (p *procs) Set(v string) error {
	name, pids, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("%q: want NAME=PID[,PID...]", v)
	}
	*p = append(*p, proc{name: name, pids: strings.Split(pids, ",")})
	return nil
}
