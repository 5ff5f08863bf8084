package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/residency"
)

// Run runs a failover drill against a running cluster: it records the
// baseline, fails (or drains) cfg.Region through the admin API, probes from
// every origin until the traffic has moved and held, recovers the region,
// probes until the traffic is back and held, and returns the report.
//
// The region is recovered whatever happens after the trigger was sent (a
// cancelled ctx included: recovery then runs on its own AdminTimeout). The
// error is non-nil when the drill could not run to the end: invalid config
// (ErrConfig), an admin API that cannot be read, a region that is not
// active (ErrRegionNotActive) — in these cases nothing was done and there
// is no report — or an unhealthy baseline (ErrBaseline), a failed trigger,
// a cancelled ctx, a region left out of service (ErrNotRecovered), which
// come with the report so far. A drill that ran to the end and missed a
// target returns the report with Passed false and a nil error.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &driller{cfg: cfg, hc: cfg.HTTP, log: cfg.Logger, probes: cfg.probes()}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = len(d.probes) + 4
		d.hc = &http.Client{Transport: tr}
		defer tr.CloseIdleConnections()
	}
	d.admin = global.NewClient(cfg.Admin, cfg.Token, d.hc)
	return d.run(ctx)
}

type driller struct {
	cfg    Config
	hc     *http.Client
	admin  *global.Client
	log    *slog.Logger
	probes []Probe
	j      *judge
	meta   drillMeta
}

// adminDone is the answer of a trigger or recover call.
type adminDone struct {
	recover    bool
	sent, done time.Time
	res        global.Result
	err        error
}

type drillState uint8

const (
	stBaseline drillState = iota
	stTriggering
	stMoving
	stRecovering
	stBack
	stDone
)

func (d *driller) adminCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.cfg.AdminTimeout)
}

// prepare reads the policy in force and the region states.
func (d *driller) prepare(ctx context.Context) (*residency.Policy, []string, error) {
	actx, cancel := d.adminCtx(ctx)
	defer cancel()
	pv, err := d.admin.Policy(actx, global.ReadOptions{Consistent: true})
	if err != nil {
		return nil, nil, fmt.Errorf("dr drill: read the residency policy: %w", err)
	}
	name := pv.Name
	if name == "" {
		name = "policy"
	}
	pol, err := residency.Parse(name, pv.Document)
	if err != nil {
		return nil, nil, fmt.Errorf("dr drill: the policy in force (%s) does not parse: %w", pv.Ref(), err)
	}
	d.meta.policy = pv.Ref()
	if rev := pol.Revision(); rev != "" {
		d.meta.policy = rev + " (" + pv.Ref() + ")"
	}
	fs, err := d.admin.FailoverStatus(actx, global.ReadOptions{Consistent: true})
	if err != nil {
		return nil, nil, fmt.Errorf("dr drill: read the region states: %w", err)
	}
	var routable, known []string
	found := false
	for _, r := range fs.Regions {
		known = append(known, r.Region)
		if r.Region == d.cfg.Region {
			found = true
			if r.State != global.RegionActive {
				return nil, nil, fmt.Errorf("%w: %s is %s (%s); recover it before drilling", ErrRegionNotActive, r.Region, r.State, r.Reason)
			}
		}
		// A region serves when it is active and has a controller.
		if r.Routable && len(r.Controllers) > 0 {
			routable = append(routable, r.Region)
		}
	}
	if !found {
		return nil, nil, fmt.Errorf("%w: the cluster does not know %s (known: %s)", ErrRegionNotActive, d.cfg.Region, strings.Join(known, ", "))
	}
	slices.Sort(routable)
	return pol, routable, nil
}

func (d *driller) run(ctx context.Context) (*Report, error) {
	pol, routable, err := d.prepare(ctx)
	if err != nil {
		return nil, err
	}
	cfg := d.cfg
	d.j = newJudge(pol, cfg.Model, cfg.Region, routable, d.probes, cfg.BaselineRounds)
	d.meta = drillMeta{cfg: cfg, policy: d.meta.policy, routable: routable, started: time.Now()}
	d.log.Info("dr drill: baseline", "region", cfg.Region, "probes", len(d.probes), "routable", routable, "policy", d.meta.policy)

	// The probes run from the baseline to the end; their results come here.
	pctx, stopProbes := context.WithCancel(ctx)
	defer stopProbes()
	results := make(chan probeResult, 4*len(d.probes))
	var wg sync.WaitGroup
	for i := range d.probes {
		offset := cfg.Interval * time.Duration(i) / time.Duration(len(d.probes))
		wg.Go(func() { d.probeLoop(pctx, i, offset, results) })
	}
	probesDone := make(chan struct{})
	go func() { wg.Wait(); close(probesDone) }()

	runErr := d.coordinate(ctx, results)

	stopProbes()
	for {
		select {
		case r := <-results:
			d.j.observe(r)
			continue
		case <-probesDone:
		}
		break
	}
	for len(results) > 0 {
		d.j.observe(<-results)
	}
	d.meta.finished = time.Now()
	d.policyUnchanged(ctx, pol)
	rep := d.j.report(d.meta)
	d.log.Info("dr drill: done", "passed", rep.Passed, "moved", optDur(rep.Moved, true), "back", optDur(rep.Back, true),
		"requests", rep.Requests, "errors", rep.Errors, "violations", rep.Violations)
	return rep, runErr
}

// coordinate drives the drill from the results: trigger after the
// baseline, recover once the traffic has moved and held (or the wait timed
// out), end once it is back and held. It returns only after every admin
// call it started has answered.
func (d *driller) coordinate(ctx context.Context, results <-chan probeResult) error {
	cfg, j := d.cfg, d.j
	adminCh := make(chan adminDone, 1)
	call := func(recover bool) {
		now := time.Now()
		if recover {
			j.markRecoverSent(now)
		} else {
			j.markTriggerSent(now)
		}
		// Admin calls outlive a cancelled ctx: a trigger is followed by a
		// recovery whatever happens.
		actx, cancel := d.adminCtx(context.WithoutCancel(ctx))
		go func() {
			defer cancel()
			req := global.FailoverRequest{Region: cfg.Region, Reason: cfg.Reason, Actor: cfg.Actor, Force: cfg.Force}
			var res global.Result
			var err error
			if recover {
				res, err = d.admin.Recover(actx, req)
			} else {
				req.Drain = cfg.Drain
				res, err = d.admin.Trigger(actx, req)
			}
			if err == nil && res.Err != nil {
				err = res.Err
			}
			adminCh <- adminDone{recover: recover, sent: now, done: time.Now(), res: res, err: err}
		}()
	}

	state := stBaseline
	deadline := time.Now().Add(cfg.BaselineTimeout)
	var holdSince time.Time
	var runErr error
	cancelled, wasCancelled := ctx.Done(), false
	timer := time.NewTimer(cfg.BaselineTimeout)
	defer timer.Stop()
	for state != stDone {
		// Waiting on an admin call needs no timer: the call is bounded.
		var wakeC <-chan time.Time
		if state == stBaseline || state == stMoving || state == stBack {
			wake := deadline
			if !holdSince.IsZero() && holdSince.Add(cfg.Hold).Before(wake) {
				wake = holdSince.Add(cfg.Hold)
			}
			timer.Reset(max(0, time.Until(wake)))
			wakeC = timer.C
		}
		var adm *adminDone
		select {
		case r := <-results:
			j.observe(r)
		case a := <-adminCh:
			adm = &a
		case <-wakeC:
		case <-cancelled:
			cancelled, wasCancelled = nil, true
			runErr = fmt.Errorf("dr drill: %w", ctx.Err())
			d.meta.aborted = "cancelled"
			switch state {
			case stBaseline, stBack:
				state = stDone
			case stMoving:
				call(true)
				state = stRecovering
			}
			continue
		}
		now := time.Now()
		switch state {
		case stBaseline:
			if j.baselineDone() {
				if why, err := j.baselineAbort(); err != nil {
					d.meta.aborted, runErr, state = why, err, stDone
					break
				}
				d.log.Info("dr drill: trigger", "region", cfg.Region, "drain", cfg.Drain)
				call(false)
				state = stTriggering
			} else if !now.Before(deadline) {
				d.meta.aborted = fmt.Sprintf("baseline not complete after %v", cfg.BaselineTimeout)
				runErr = fmt.Errorf("%w: nothing was triggered: the probes did not complete %d rounds in %v", ErrBaseline, cfg.BaselineRounds, cfg.BaselineTimeout)
				state = stDone
			}
		case stTriggering:
			if adm == nil {
				break
			}
			if adm.err != nil {
				// The change may have been committed all the same: recover.
				d.log.Error("dr drill: trigger failed; recovering in case it was applied", "region", cfg.Region, "err", adm.err)
				d.meta.triggerErr = adm.err.Error()
				d.meta.aborted = "trigger failed: " + adm.err.Error()
				runErr = fmt.Errorf("dr drill: trigger %s: %w", cfg.Region, adm.err)
				call(true)
				state = stRecovering
				break
			}
			j.markTriggerReturned(adm.done)
			d.meta.triggerDetail = resultDetail(adm.res)
			d.log.Info("dr drill: failed over; waiting for traffic to move", "region", cfg.Region, "call", adm.done.Sub(adm.sent))
			if wasCancelled { // while the trigger was in flight
				call(true)
				state = stRecovering
				break
			}
			state, deadline, holdSince = stMoving, adm.done.Add(cfg.MovedTimeout), time.Time{}
		case stMoving:
			switch {
			case j.allMoved():
				if holdSince.IsZero() {
					holdSince = now
				}
				if now.Sub(holdSince) >= cfg.Hold {
					d.log.Info("dr drill: traffic moved; recover", "region", cfg.Region)
					call(true)
					state, holdSince = stRecovering, time.Time{}
				}
			case !now.Before(deadline):
				d.meta.movedGaveUp = now
				d.log.Warn("dr drill: traffic did not move in time; recover", "region", cfg.Region, "waited", cfg.MovedTimeout)
				call(true)
				state, holdSince = stRecovering, time.Time{}
			default:
				holdSince = time.Time{}
			}
		case stRecovering:
			if adm == nil {
				break
			}
			if adm.err != nil {
				d.log.Error("dr drill: recover failed", "region", cfg.Region, "err", adm.err)
				d.meta.recoverErr = adm.err.Error()
				d.meta.aborted = "recover failed: " + adm.err.Error()
				runErr = errors.Join(runErr, fmt.Errorf("%w: %s is still out of service (run `meridian failover recover --region %s`): %w",
					ErrNotRecovered, cfg.Region, cfg.Region, adm.err))
				state = stDone
				break
			}
			j.markRecoverReturned(adm.done)
			d.log.Info("dr drill: recovered; waiting for traffic to come back", "region", cfg.Region, "call", adm.done.Sub(adm.sent))
			d.meta.recovered = true
			d.meta.recoverDetail = resultDetail(adm.res)
			if d.meta.aborted != "" {
				state = stDone
				break
			}
			state, deadline, holdSince = stBack, adm.done.Add(cfg.BackTimeout), time.Time{}
		case stBack:
			switch {
			case j.allBack():
				if holdSince.IsZero() {
					holdSince = now
				}
				if now.Sub(holdSince) >= cfg.Hold {
					state = stDone
				}
			case !now.Before(deadline):
				d.meta.backGaveUp = now
				state = stDone
			default:
				holdSince = time.Time{}
			}
		}
	}
	return runErr
}

func resultDetail(res global.Result) string {
	s := fmt.Sprintf("raft index %d", res.Index)
	if res.Region != nil {
		s = fmt.Sprintf("%s is %s (%s)", res.Region.Region, res.Region.State, s)
	}
	if !res.Changed {
		s += "; nothing changed"
	}
	return s
}

// policyUnchanged notes a policy applied during the drill: the verdict on
// violations used the policy read at the start.
func (d *driller) policyUnchanged(ctx context.Context, pol *residency.Policy) {
	actx, cancel := d.adminCtx(context.WithoutCancel(ctx))
	defer cancel()
	pv, err := d.admin.Policy(actx, global.ReadOptions{})
	if err != nil {
		d.meta.notes = append(d.meta.notes, "could not read the policy at the end: "+err.Error())
		return
	}
	if pv.SHA256 != pol.Digest() { // both the hex SHA-256 of the document
		d.meta.notes = append(d.meta.notes, fmt.Sprintf("the residency policy changed during the drill (now %s): results were judged against the policy at the start", pv.Ref()))
	}
}

// probeLoop sends probe i every Interval (one request in flight) until ctx
// ends, starting after offset so the probes spread over the interval.
func (d *driller) probeLoop(ctx context.Context, i int, offset time.Duration, out chan<- probeResult) {
	t := time.NewTimer(offset)
	defer t.Stop()
	for seq := 0; ; seq++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		r := d.send(ctx, i, seq)
		if ctx.Err() != nil {
			return // stopped: the last answer may be cut short, so it is not judged
		}
		select {
		case out <- r:
		case <-ctx.Done():
			return
		}
		t.Reset(max(0, d.cfg.Interval-time.Since(start)))
	}
}

// send makes one probe request.
func (d *driller) send(ctx context.Context, i, seq int) probeResult {
	p := d.probes[i]
	body, _ := json.Marshal(map[string]any{"model": d.cfg.Model, "max_tokens": 1, "stream": false,
		"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("meridian dr drill probe %s #%d", p, seq)}}})
	rctx, cancel := context.WithTimeout(ctx, d.cfg.ProbeTimeout)
	defer cancel()
	r := probeResult{probe: i, seq: seq, sent: time.Now()}
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, strings.TrimRight(d.cfg.Controllers[p.Origin], "/")+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		r.done, r.errKind, r.detail = time.Now(), "request", err.Error()
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	if p.Tenant != "" {
		req.Header.Set("X-Tenant-Id", p.Tenant)
	}
	if p.DataClass != "" {
		req.Header.Set("X-Data-Class", p.DataClass)
	}
	req.Header.Set("X-Request-Id", fmt.Sprintf("dr-drill-%s-%d-%d", d.cfg.Region, i, seq))
	resp, err := d.hc.Do(req)
	if err != nil {
		r.done, r.errKind, r.detail = time.Now(), transportKind(err), err.Error()
		return r
	}
	b, rerr := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	r.done = time.Now()
	r.status = resp.StatusCode
	r.region = resp.Header.Get("X-Meridian-Region")
	r.forwarded = resp.Header.Get("X-Meridian-Forwarded-To")
	r.decision = resp.Header.Get("X-Meridian-Decision-Id")
	if rerr != nil {
		r.errKind, r.detail = "body_"+transportKind(rerr), rerr.Error()
		return r
	}
	if r.status != http.StatusOK {
		var eb struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
			r.code, r.detail = eb.Error.Code, eb.Error.Message
		} else {
			r.detail = excerpt(b)
		}
	}
	return r
}

// transportKind names a transport failure compactly (the outcome compared
// and counted); the full message goes to the report's detail.
func transportKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection_refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "connection_reset"
	}
	return "transport"
}

func excerpt(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}
