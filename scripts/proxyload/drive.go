package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
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
	LateShare     float64            `json:"late_share"`        // handed on > 1 ms after due by the pacer (judged: -max-late)
	WorkerLate    float64            `json:"worker_late_share"` // started > 1 ms after handed on, by a worker waiting for a CPU (not judged)
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
	maxLate := fs.Float64("max-late", 0.01, "share of requests the pacer handed on over 1 ms after due above which a window is invalid (a worker's wait for a CPU is reported, not judged)")
	tries := fs.Int("tries", 3, "windows per rate at most, pooled while the CI straddles -max-added")
	resamples := fs.Int("resamples", 1000, "bootstrap resamples")
	maxRate := fs.Float64("max-rate", 40000, "highest rate tried")
	minRate := fs.Float64("min-rate", 250, "lowest rate tried when -rate does not pass")
	bisections := fs.Int("bisections", 3, "halvings of the gap between the highest rate passed and the lowest not passed")
	warmup := fs.Duration("warmup", time.Second, "unmeasured load at each rate before its window")
	stream := fs.Bool("stream", false, "ask for streamed answers")
	header := fs.String("header", "", "NAME:VALUE header sent to the targets (not the backend)")
	cacert := fs.String("cacert", "", "PEM file of the CA that https targets' certificates chain to")
	conns := fs.Int("conns", 128, "kept-alive connections per arm (one worker goroutine holds one of each)")
	var ps procs
	fs.Var(&ps, "procs", "NAME=PID[,PID...]: processes whose CPU each window reports (repeat)")
	_ = fs.Parse(args)
	if *direct == "" || len(tgts) == 0 {
		return errors.New("drive: -direct and at least one -target are required")
	}
	d := &driver{body: chatBody(*stream), procs: ps}
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
	for _, t := range tgts {
		name, u, ok := strings.Cut(t, "=")
		if !ok {
			return fmt.Errorf("-target %q: want NAME=URL", t)
		}
		if err := d.open(*direct, u, *conns); err != nil {
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
		line, err := json.Marshal(res)
		if err != nil {
			return err
		}
		fmt.Println(string(line))
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

// driver sends the requests from a fixed set of worker goroutines, each
// holding one kept-alive HTTP/1.1 connection to the backend and one to
// the target (so both arms have pools of the same size), each request
// serialized into its connection's buffer and written in one call, its
// answer read by the worker that sent it: net/http's client (a reader and
// a writer goroutine per connection, a request built and its body copied
// anew each time) cost about 200 us of CPU per request, more than the
// proxies measured, and capped the rate the machine could offer any of
// them. A window hands each due request to the worker that went idle last
// (as net/http's transport reuses connections: a few carry the load), or,
// when all are busy, queues it for the first to finish.
type driver struct {
	body           func(dst []byte, n int) []byte
	hdrKey, hdrVal string
	tls            *tls.Config
	seq            atomic.Int64
	ends           [2]*endpoint // direct, proxied
	procs          procs        // whose CPU each window reports
	workers        []*worker    // idle, the most recently used last
}

type endpoint struct {
	scheme, host, path string
	proxied            bool
}

type worker struct {
	ch    chan job
	conns [2]*clientConn
}

type clientConn struct {
	c    net.Conn
	br   *bufio.Reader
	buf  []byte // the request being written
	body []byte // its body
}

// job is request i of a window, due at due and handed on by the pacer at
// at, for arm (0 direct, 1 proxied).
type job struct {
	s       *session
	i       int
	due, at time.Time
	arm     int
	queued  bool
}

// session is one window: its results and its idle workers and queue.
type session struct {
	deadline atomic.Int64 // unix nanoseconds: requests not done by then fail
	lat      []float64    // by request; +Inf until it succeeds
	arm      []int8
	late     int          // pacer's lag over maxLag (the pacer's own)
	wlate    atomic.Int64 // worker's start delay over maxLag
	wg       sync.WaitGroup
	mu       sync.Mutex
	idle     []*worker
	queue    []job
	head     int
	queued   int
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

// open starts n workers for the backend at direct and the target at
// target, each with its two connections dialed and checked with one
// request.
func (d *driver) open(direct, target string, n int) error {
	for arm, u := range []string{direct, target} {
		e, err := parseEndpoint(u, arm == 1)
		if err != nil {
			return err
		}
		d.ends[arm] = e
	}
	for range n {
		w := &worker{ch: make(chan job, 1)}
		d.workers = append(d.workers, w)
		go d.work(w)
		for arm := range d.ends {
			code, _, err := d.send(w, arm, time.Now().Add(10*time.Second))
			if err == nil && code != 200 {
				err = fmt.Errorf("status %d", code)
			}
			if err != nil {
				return fmt.Errorf("%s://%s%s: %w", d.ends[arm].scheme, d.ends[arm].host, d.ends[arm].path, err)
			}
		}
	}
	return nil
}

// close stops the workers and closes their connections.
func (d *driver) close() {
	for _, w := range d.workers {
		close(w.ch)
		for _, cc := range w.conns {
			if cc != nil {
				cc.c.Close()
			}
		}
	}
	d.workers = nil
}

func (d *driver) dial(e *endpoint, deadline time.Time) (*clientConn, error) {
	dl := net.Dialer{Deadline: deadline}
	c, err := dl.Dial("tcp", e.host)
	if err != nil {
		return nil, err
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
			return nil, err
		}
		c = tc
	}
	return &clientConn{c: c, br: bufio.NewReaderSize(c, 16<<10)}, nil
}

// send writes one request on w's connection for arm (dialing it if
// needed) and reads the answer to the end: its status, and when it was
// written. A kept-alive connection the other end closed while idle is
// dialed again once.
func (d *driver) send(w *worker, arm int, deadline time.Time) (code int, sent time.Time, err error) {
	e := d.ends[arm]
	for attempt := 0; ; attempt++ {
		cc := w.conns[arm]
		reused := cc != nil
		if cc == nil {
			if cc, err = d.dial(e, deadline); err != nil {
				return 0, time.Time{}, err
			}
			w.conns[arm] = cc
		}
		_ = cc.c.SetDeadline(deadline)
		b := append(cc.buf[:0], "POST "...)
		b = append(append(append(append(b, e.path...), " HTTP/1.1\r\nHost: "...), e.host...), "\r\nContent-Type: application/json\r\n"...)
		if e.proxied && d.hdrKey != "" {
			b = append(append(append(append(b, d.hdrKey...), ": "...), d.hdrVal...), "\r\n"...)
		}
		cc.body = d.body(cc.body[:0], int(d.seq.Add(1)))
		b = strconv.AppendInt(append(b, "Content-Length: "...), int64(len(cc.body)), 10)
		b = append(append(b, "\r\n\r\n"...), cc.body...)
		cc.buf = b
		sent = time.Now()
		var keep, answered bool
		code, keep, answered, err = cc.exchange(b)
		if err != nil || !keep {
			cc.c.Close()
			w.conns[arm] = nil
		}
		if err != nil && reused && !answered && attempt == 0 && !errors.Is(err, os.ErrDeadlineExceeded) {
			continue // closed while idle: once more on a new connection
		}
		return code, sent, err
	}
}

// exchange writes req and reads the answer to the end: its status,
// whether the connection can carry another request, and whether any of
// the answer arrived.
func (cc *clientConn) exchange(req []byte) (code int, keep, answered bool, err error) {
	if _, err := cc.c.Write(req); err != nil {
		return 0, false, false, err
	}
	for {
		line, err := cc.br.ReadSlice('\n')
		if err != nil {
			return 0, false, answered, err
		}
		answered = true
		_, rest, _ := strings.Cut(string(line), " ")
		if len(rest) < 3 {
			return 0, false, true, fmt.Errorf("status line %q", line)
		}
		if code, err = strconv.Atoi(rest[:3]); err != nil {
			return 0, false, true, fmt.Errorf("status line %q", line)
		}
		length, chunked := int64(-1), false
		keep = true
		for {
			k, v, end, err := headerLine(cc.br)
			if err != nil {
				return code, false, true, err
			}
			if end {
				break
			}
			switch {
			case bytes.EqualFold(k, []byte("Content-Length")):
				if length, err = strconv.ParseInt(string(v), 10, 64); err != nil {
					return code, false, true, err
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
		return code, keep && err == nil, true, err
	}
}

// work runs w's jobs: the one handed to it, then the session's queue
// until it is empty; then w waits, idle, for the next. A job is done
// (wg) only once its worker has taken the next or gone back to the idle
// list, so that when the window's jobs are all done its workers are idle.
func (d *driver) work(w *worker) {
	for j := range w.ch {
		s := j.s
		for {
			d.do(w, j)
			s.mu.Lock()
			if s.head < len(s.queue) {
				j = s.queue[s.head]
				s.head++
				s.mu.Unlock()
				s.wg.Done()
				continue
			}
			s.idle = append(s.idle, w)
			s.mu.Unlock()
			s.wg.Done()
			break
		}
	}
}

func (d *driver) do(w *worker, j job) {
	deadline := time.Unix(0, j.s.deadline.Load())
	if !time.Now().Before(deadline) {
		return // too late: it counts as not completed
	}
	code, sent, err := d.send(w, j.arm, deadline)
	if err != nil || code != 200 {
		return
	}
	lat := time.Since(j.due)
	if workerLate(j.at, sent, j.queued) {
		j.s.wlate.Add(1)
	}
	j.s.lat[j.i] = float64(lat) / 1e3
}

// dispatch hands j to the worker idle last, or queues it.
func (s *session) dispatch(j job) {
	s.mu.Lock()
	if n := len(s.idle); n > 0 && s.head == len(s.queue) {
		w := s.idle[n-1]
		s.idle = s.idle[:n-1]
		s.mu.Unlock()
		w.ch <- j
		return
	}
	j.queued = true
	s.queued++
	s.queue = append(s.queue, j)
	s.mu.Unlock()
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
func (d *driver) window(rate, ratio float64, samples int, length time.Duration) window {
	total := rate * (1 + ratio)
	directShare := ratio / (1 + ratio)
	n := int(math.Ceil(total * length.Seconds()))
	interval := float64(time.Second) / total
	s := &session{lat: make([]float64, n), arm: make([]int8, n), idle: d.workers}
	for i := range s.lat {
		s.lat[i] = math.Inf(1)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(d.seq.Load())))
	cpu0, other0 := selfCPU(), procCPU(d.procs)
	start := time.Now().Add(time.Millisecond)
	s.deadline.Store(start.Add(length + length/10 + time.Second).UnixNano())
	var counts [2]int
	offered := 0
	for i := 0; i < n; i++ {
		if samples > 0 && counts[0] >= samples && counts[1] >= samples {
			break
		}
		due := start.Add(time.Duration(float64(i) * interval))
		if w := time.Until(due); w > 0 {
			ts := syscall.NsecToTimespec(int64(w))
			for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
			}
		}
		arm := 1
		if rng.Float64() < directShare {
			arm = 0
		}
		counts[arm]++
		s.arm[i] = int8(arm)
		s.wg.Add(1)
		offered++
		at := time.Now()
		if pacerLate(due, at) {
			s.late++
		}
		s.dispatch(job{s: s, i: i, due: due, at: at, arm: arm})
		// Let the worker send it now, on this thread, rather than after
		// the next sleep.
		runtime.Gosched()
	}
	end := time.Now()
	if dl := end.Add(end.Sub(start)/10 + time.Second).UnixNano(); dl < s.deadline.Load() {
		s.deadline.Store(dl) // requests in flight keep the deadline they were sent with
	}
	s.wg.Wait()
	wall := time.Since(start).Seconds()
	d.workers = s.idle
	var out window
	out.offered, out.late, out.workerLate, out.queued = offered, s.late, int(s.wlate.Load()), s.queued
	out.genCPU, out.wall = selfCPU()-cpu0, wall
	out.procCPU = procCPU(d.procs)
	for i := range out.procCPU {
		out.procCPU[i] -= other0[i]
	}
	for i := 0; i < offered; i++ {
		if s.arm[i] == 0 {
			out.direct = append(out.direct, s.lat[i])
		} else {
			out.proxied = append(out.proxied, s.lat[i])
		}
	}
	return out
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
