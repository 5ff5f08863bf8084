package global

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// forwardedHeader marks a request forwarded to the leader: it is never
// forwarded again (one hop at most), the receiver answers not_leader instead.
const forwardedHeader = "X-Meridian-Forwarded"

// NewRequestID returns a random request id for an idempotent write.
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// WriteOptions are the common fields of a write.
type WriteOptions struct {
	// RequestID makes the write idempotent: retrying with the same id returns
	// the first result. Empty: a new random id (retries inside the node keep
	// it).
	RequestID string
	// Actor is who the request says asks ("operator:alice"), a label
	// recorded with the change; the audit record keeps it as
	// claimed_actor beside the authenticated actor (By).
	Actor string
	// By is who asks as authenticated: the admin API sets it from the
	// request (RequestActor). It is the actor of the action's audit
	// record. Zero: the controller itself (an in-process caller such as
	// the automatic failover or the bootstrap policy).
	By Actor
}

// PolicyApplied is the answer to a policy apply: the active version after
// it, without its document.
type PolicyApplied struct {
	PolicyVersion
	// Unchanged: the document was the active policy already (the same
	// SHA-256), and no version was added.
	Unchanged bool `json:"unchanged,omitempty"`
}

// ApplyPolicy validates doc with the configured PolicyValidator and commits
// it as the new active policy. name is the file name, for messages. A
// document identical to the active policy adds no version: the answer is
// the active version, Unchanged (the state machine decides it, so it holds
// against concurrent applies too).
//
// The apply is a privileged action: it is recorded in Config.Audit (by
// o.By) before it is proposed, and refused if it cannot be (an
// *audit.NotRecordedError); a refused apply is recorded as refused.
func (n *Node) ApplyPolicy(ctx context.Context, name string, doc []byte, reason string, o WriteOptions) (PolicyApplied, error) {
	o = o.withRequestID()
	sum := sha256.Sum256(doc)
	act := n.action(ActionPolicyApply, o, "", map[string]string{
		"name": name, "sha256": hex.EncodeToString(sum[:]), "size": strconv.Itoa(len(doc)), "reason": reason})
	declared, err := n.validatePolicy(name, doc)
	if err != nil {
		return PolicyApplied{}, n.admin().Refuse(ctx, act, err)
	}
	act.Args["declared"] = declared
	c := &command{Op: opPolicyApply, RequestID: o.RequestID, Actor: o.Actor,
		Policy: &policyCmd{Name: name, Declared: declared, Reason: reason, Document: doc, UnlessActive: true}}
	if rej := n.stamp(c); rej != nil {
		return PolicyApplied{}, n.admin().Refuse(ctx, act, fmt.Errorf("apply policy %s: %w", name, rej))
	}
	var res Result
	err = n.admin().Run(ctx, act, func(ctx context.Context) (err error) {
		res, err = n.submit(ctx, c, false)
		return errorf(err, "apply policy %s", name)
	})
	if err != nil {
		return PolicyApplied{}, err
	}
	return PolicyApplied{PolicyVersion: *res.Policy, Unchanged: !res.Changed}, nil
}

func (n *Node) validatePolicy(name string, doc []byte) (string, error) {
	if len(doc) == 0 {
		return "", fmt.Errorf("%w: %s is empty", ErrInvalidPolicy, name)
	}
	if len(doc) > MaxPolicySize {
		return "", fmt.Errorf("%w: %s is %d bytes, more than the limit of %d", ErrInvalidPolicy, name, len(doc), MaxPolicySize)
	}
	if n.cfg.PolicyValidator == nil {
		return "", nil
	}
	v, err := n.cfg.PolicyValidator(name, doc)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidPolicy, err)
	}
	return v, nil
}

// RegionChange asks for a region state change.
type RegionChange struct {
	Region string
	State  RegionState
	Reason string
	// Expect, if set, makes the change conditional: it fails with
	// ErrConflict unless the region is in that state.
	Expect *RegionState
	// Automatic marks a change decided by the automatic failover.
	Automatic bool
	// Force allows a region the cluster does not know yet, and taking a
	// region out of service when that leaves some traffic with no region
	// its residency policy allows.
	Force bool
}

// SetRegionState commits a region state change. A change to the state the
// region already has succeeds with Result.Changed false. Taking a region
// out of service (failed or draining) that would leave some traffic with no
// region the residency policy allows is refused (CodeStrandsTraffic,
// naming that traffic) unless ch.Force or ch.Automatic.
//
// The change is a privileged action (failover_trigger, failover_recover),
// recorded in Config.Audit before it is proposed, as ApplyPolicy is.
func (n *Node) SetRegionState(ctx context.Context, ch RegionChange, o WriteOptions) (Result, error) {
	o = o.withRequestID()
	act := n.action(regionAction(ch.State), o, ch.Region, regionArgs(ch))
	c := &command{Op: opRegionSet, RequestID: o.RequestID, Actor: o.Actor, Region: &regionCmd{
		Region: ch.Region, State: ch.State, Reason: ch.Reason, Expect: ch.Expect, Automatic: ch.Automatic, Force: ch.Force,
	}}
	rej := n.stamp(c)
	if rej == nil {
		rej = n.checkStranded(ch)
	}
	if rej != nil {
		return Result{}, n.admin().Refuse(ctx, act, fmt.Errorf("set region %s to %s: %w", ch.Region, ch.State, rej))
	}
	var res Result
	err := n.admin().Run(ctx, act, func(ctx context.Context) (err error) {
		res, err = n.submit(ctx, c, false)
		return errorf(err, "set region %s to %s", ch.Region, ch.State)
	})
	return res, err
}

// checkStranded refuses a change that takes ch.Region out of service and
// leaves traffic with nowhere to go that had somewhere before.
func (n *Node) checkStranded(ch RegionChange) *RejectedError {
	if n.cfg.Stranded == nil || ch.Force || ch.Automatic || ch.State == RegionActive {
		return nil
	}
	st := n.State()
	compiled, err := st.CompiledPolicy()
	if err != nil || compiled == nil {
		return nil
	}
	before := n.cfg.Stranded(compiled, func(r string) bool { return !st.Routable(r) })
	after := n.cfg.Stranded(compiled, func(r string) bool { return r == ch.Region || !st.Routable(r) })
	var lost []string
	for _, s := range after {
		if !slices.Contains(before, s) {
			lost = append(lost, s)
		}
	}
	if len(lost) == 0 {
		return nil
	}
	return rejectf(CodeStrandsTraffic, "taking %s out of service leaves traffic with no region its residency policy allows: %s; those requests would be refused (503). Repeat with force to do it anyway",
		ch.Region, strings.Join(lost, "; "))
}

// Trigger fails region over: it stops taking traffic (RegionFailed), and
// routers send its requests to allowed healthy regions.
func (n *Node) Trigger(ctx context.Context, region, reason string, o WriteOptions) (Result, error) {
	return n.SetRegionState(ctx, RegionChange{Region: region, State: RegionFailed, Reason: reason}, o)
}

// Drain stops new traffic to region (RegionDraining).
func (n *Node) Drain(ctx context.Context, region, reason string, o WriteOptions) (Result, error) {
	return n.SetRegionState(ctx, RegionChange{Region: region, State: RegionDraining, Reason: reason}, o)
}

// Recover makes region active again.
func (n *Node) Recover(ctx context.Context, region, reason string, o WriteOptions) (Result, error) {
	return n.SetRegionState(ctx, RegionChange{Region: region, State: RegionActive, Reason: reason}, o)
}

// SetTargets sets the ordered failover targets of region (empty clears them).
// It is a privileged action (failover_targets), recorded in Config.Audit
// before it is proposed, as ApplyPolicy is.
func (n *Node) SetTargets(ctx context.Context, region string, targets []string, o WriteOptions) (Result, error) {
	o = o.withRequestID()
	act := n.action(ActionFailoverTargets, o, region, map[string]string{"targets": strings.Join(targets, ",")})
	c := &command{Op: opTargetsSet, RequestID: o.RequestID, Actor: o.Actor,
		Targets: &targetsCmd{Region: region, Targets: targets}}
	if rej := n.stamp(c); rej != nil {
		return Result{}, n.admin().Refuse(ctx, act, fmt.Errorf("set failover targets of %s: %w", region, rej))
	}
	var res Result
	err := n.admin().Run(ctx, act, func(ctx context.Context) (err error) {
		res, err = n.submit(ctx, c, false)
		return errorf(err, "set failover targets of %s", region)
	})
	return res, err
}

// AppendCheckpoint anchors an audit chain head. Sequences of a controller
// must not go back; resubmitting the latest checkpoint unchanged is a no-op.
// It is not recorded in the audit log: the log's own checkpoints come this
// way, and recording each would move the chain head it anchors (a
// checkpoint posted to the admin API is recorded there).
func (n *Node) AppendCheckpoint(ctx context.Context, cp Checkpoint, o WriteOptions) (Result, error) {
	c := &command{Op: opCheckpoint, RequestID: o.RequestID, Actor: o.Actor, Checkpoint: &cp}
	res, err := n.submit(ctx, c, false)
	if err != nil {
		return res, fmt.Errorf("append audit checkpoint of %s: %w", cp.ControllerID, err)
	}
	return res, nil
}

// submit stamps, validates and encodes a command and commits it on the
// leader: locally when this node leads, else forwarded to the leader's admin
// API. It retries across leader changes with the same request id until
// HoldTimeout. hop is true for a request that was forwarded to this node.
func (n *Node) submit(ctx context.Context, c *command, hop bool) (Result, error) {
	if n.closed.Load() {
		return Result{}, ErrClosed
	}
	if rej := n.stamp(c); rej != nil {
		return Result{}, rej
	}
	data, err := encodeCommand(c)
	if err != nil {
		return Result{}, err
	}
	start := time.Now()
	var (
		res       Result
		forwarded bool
	)
	err = n.onLeader(ctx, hop,
		func(context.Context) error {
			r, err := n.applyLocal(data)
			res, forwarded = r, false
			if err == nil {
				// Followers learn a commit index with the next append; a
				// barrier appends one now, so a change (a failover above all)
				// reaches every router, and a forwarding follower returns,
				// within a round trip instead of a commit timeout. Writes
				// are rare control-plane events: the extra entry is cheap.
				n.raft.Barrier(n.cfg.Timing.HeartbeatTimeout)
			}
			return err
		},
		func(ctx context.Context, admin string) error {
			r, err := n.forwardApply(ctx, admin, data)
			res, forwarded = r, true
			return err
		})
	if err == nil && forwarded {
		// Read your writes on the accepting node: return once the local
		// state holds the change (bounded by MaxStale; the write is
		// committed either way).
		n.waitApplied(ctx, res.Index)
	}
	n.m.submits.WithLabelValues(string(c.Op)).Observe(time.Since(start).Seconds())
	if err != nil {
		return Result{}, err
	}
	if res.Err != nil {
		return res, res.Err
	}
	return res, nil
}

// applyLocal proposes data on this node (which must lead) and waits for the
// state machine's result.
func (n *Node) applyLocal(data []byte) (Result, error) {
	f := n.raft.Apply(data, n.cfg.HoldTimeout)
	if err := f.Error(); err != nil {
		return Result{}, err
	}
	res, ok := f.Response().(*Result)
	if !ok || res == nil {
		return Result{}, fmt.Errorf("apply: unexpected state machine response %T", f.Response())
	}
	return *res, nil
}

// waitApplied waits until the local state machine has applied index (State
// holds it), ctx ends or MaxStale passes.
func (n *Node) waitApplied(ctx context.Context, index uint64) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.MaxStale)
	defer cancel()
	n.fsm.waitApplied(ctx.Done(), index)
}

// onLeader runs local when this node leads, otherwise remote with the
// leader's admin address, retrying retryable failures (no leader, leadership
// lost, leader unreachable) on every leader change or after a short backoff,
// until ctx ends or HoldTimeout passes. A forwarded request (hop) is never
// forwarded again.
func (n *Node) onLeader(ctx context.Context, hop bool, local func(context.Context) error, remote func(context.Context, string) error) error {
	hold, cancel := context.WithTimeout(ctx, n.cfg.HoldTimeout)
	defer cancel()
	backoff := 5 * time.Millisecond
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	var lastErr error
	for {
		if n.closed.Load() {
			return ErrClosed
		}
		changed := n.LeaderChanged()
		var err error
		if n.raft.State() == raft.Leader {
			err = local(hold)
		} else if hop {
			return ErrNotLeader
		} else if _, id := n.raft.LeaderWithID(); id == "" {
			err = errors.New("no leader is known")
		} else if m, ok := n.State().Member(string(id)); !ok {
			err = fmt.Errorf("the admin address of leader %s is not known yet", id)
		} else if m.ID == n.cfg.NodeID {
			err = errors.New("leadership is moving")
		} else {
			err = remote(hold, m.AdminAddr)
			if err == nil {
				n.m.forwarded.WithLabelValues("ok").Inc()
			} else {
				n.m.forwarded.WithLabelValues("error").Inc()
			}
		}
		if err != nil && errors.Is(err, context.DeadlineExceeded) && hold.Err() != nil {
			// The deadline ended during the attempt (a leader that could
			// not commit, or a forward it did not answer in time): no
			// leader took the write, and its outcome is unknown.
			if ctx.Err() != nil {
				return fmt.Errorf("%w: %w", ErrNoLeader, err)
			}
			return fmt.Errorf("%w within %v: %w; %s", ErrNoLeader, n.cfg.HoldTimeout, err, n.quorumReport())
		}
		if err == nil || !retryable(err) {
			return err
		}
		lastErr = err
		timer.Reset(backoff)
		select {
		case <-hold.Done():
			if ctx.Err() != nil {
				// No leader took it before the caller gave up: that is
				// what ErrNoLeader says, whoever's deadline ended first.
				return fmt.Errorf("%w: %w (last error: %v)", ErrNoLeader, ctx.Err(), lastErr)
			}
			return fmt.Errorf("%w within %v: %v; %s", ErrNoLeader, n.cfg.HoldTimeout, lastErr, n.quorumReport())
		case <-changed:
			if !timer.Stop() {
				<-timer.C
			}
		case <-timer.C:
		}
		backoff = min(backoff*2, 200*time.Millisecond)
	}
}

// retryable reports whether a failed attempt may be retried (with the same
// request id) against the next leader.
func retryable(err error) bool {
	var rej *RejectedError
	if errors.As(err, &rej) {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var api *APIError
	if errors.As(err, &api) {
		switch api.Code {
		case CodeNoLeader, CodeNotLeader, CodeClosed:
			return true
		}
		return api.Status == http.StatusBadGateway || api.Status == http.StatusServiceUnavailable
	}
	if errors.Is(err, ErrClosed) {
		return false
	}
	// Raft errors (not leader, leadership lost, transfer in progress, enqueue
	// timeout, aborted by restore) and network errors reaching the leader.
	return true
}

// forwardApply sends an encoded command to the leader's admin API.
func (n *Node) forwardApply(ctx context.Context, admin string, data []byte) (Result, error) {
	var res Result
	err := n.forward(ctx, http.MethodPost, admin+"/v1/global/apply", data, &res)
	return res, err
}

// forward performs one request to another node's admin API with the hop
// marker and decodes the JSON answer into out (an error body into *APIError).
func (n *Node) forward(ctx context.Context, method, url string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("forward to leader: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+n.cfg.AdminToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(forwardedHeader, n.cfg.NodeID)
	resp, err := n.httpc.Do(req)
	if err != nil {
		return fmt.Errorf("forward to leader %s: %w", url, err)
	}
	defer drainBody(resp.Body)
	return decodeResponse(resp, out)
}

// decodeResponse decodes a 2xx JSON body into out, or an error body into
// *APIError.
func decodeResponse(resp *http.Response, out any) error {
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("read response: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		return apiErrorFrom(resp.StatusCode, b)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	return nil
}

// quorumReport says how many of the Raft configuration's voters this node
// can reach (a connection to their Raft address through the transport's
// network, each within a second),
// for the error of a write that found no leader: "1 of 3 voters reachable
// (ctl-b, ctl-c unreachable)" points the operator at the lost quorum, not
// at the admin API that answered.
func (n *Node) quorumReport() string {
	servers, err := n.Servers()
	if err != nil {
		return "voters unknown: " + err.Error()
	}
	var voters []Server
	for _, s := range servers {
		if s.Suffrage == "voter" {
			voters = append(voters, s)
		}
	}
	up := make([]bool, len(voters))
	var wg sync.WaitGroup
	for i, s := range voters {
		if s.ID == n.cfg.NodeID {
			up[i] = true
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c, err := n.layer.Dial(raft.ServerAddress(s.Address), time.Second); err == nil {
				c.Close()
				up[i] = true
			}
		}()
	}
	wg.Wait()
	reachable := 0
	var down []string
	for i, ok := range up {
		if ok {
			reachable++
		} else {
			down = append(down, voters[i].ID)
		}
	}
	msg := fmt.Sprintf("%d of %d voters reachable from %s", reachable, len(voters), n.cfg.NodeID)
	if len(down) > 0 {
		msg += " (" + strings.Join(down, ", ") + " unreachable)"
	}
	if reachable <= len(voters)/2 {
		msg += ": the Raft quorum is lost; bring voters back (or recover the cluster with peers.json, see the global package docs)"
	}
	return msg
}
