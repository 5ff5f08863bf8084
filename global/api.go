package global

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// PolicyRequest applies a policy document.
type PolicyRequest struct {
	Name      string `json:"name"`
	Document  string `json:"document"`
	Reason    string `json:"reason,omitempty"`
	Actor     string `json:"actor,omitempty"`
	RequestID string `json:"request_id,omitempty"`
}

// RegionRequest sets a region's state.
type RegionRequest struct {
	State     RegionState  `json:"state"`
	Reason    string       `json:"reason,omitempty"`
	Expect    *RegionState `json:"expect,omitempty"`
	Force     bool         `json:"force,omitempty"`
	Actor     string       `json:"actor,omitempty"`
	RequestID string       `json:"request_id,omitempty"`
}

// FailoverRequest triggers or recovers a region.
type FailoverRequest struct {
	Region string `json:"region"`
	Reason string `json:"reason,omitempty"`
	// Drain (trigger only) drains the region instead of failing it: no new
	// traffic, requests in flight finish.
	Drain bool `json:"drain,omitempty"`
	// Force accepts a region the cluster does not know yet, and a
	// failover that leaves some traffic with no allowed region.
	Force     bool   `json:"force,omitempty"`
	Actor     string `json:"actor,omitempty"`
	RequestID string `json:"request_id,omitempty"`
}

// TargetsRequest sets a region's failover targets.
type TargetsRequest struct {
	Targets   []string `json:"targets"`
	Actor     string   `json:"actor,omitempty"`
	RequestID string   `json:"request_id,omitempty"`
}

// CheckpointRequest anchors an audit checkpoint.
type CheckpointRequest struct {
	Checkpoint Checkpoint `json:"checkpoint"`
	Actor      string     `json:"actor,omitempty"`
	RequestID  string     `json:"request_id,omitempty"`
}

// RegionView is one region in a failover status.
type RegionView struct {
	RegionStatus
	Routable    bool     `json:"routable"`
	Targets     []string `json:"targets,omitempty"`
	Controllers []string `json:"controllers,omitempty"`
	// Liveness of each controller as the answering controller sees it
	// (alive, suspect, dead, or unknown), when it can tell (Config.Liveness).
	Liveness map[string]string `json:"liveness,omitempty"`
}

// FailoverStatus is the failover picture of every known region.
type FailoverStatus struct {
	StateIndex uint64       `json:"state_index"`
	Regions    []RegionView `json:"regions"`
	Health     Health       `json:"health"`
}

// NodeStatus is GET /v1/global/status.
type NodeStatus struct {
	Health  Health         `json:"health"`
	Servers []Server       `json:"servers"`
	Members []Member       `json:"members"`
	Policy  *PolicyVersion `json:"policy,omitempty"`
}

// PolicyHistory is GET /v1/global/policy?history=1.
type PolicyHistory struct {
	StateIndex uint64          `json:"state_index"`
	Versions   []PolicyVersion `json:"versions"`
}

// RegionList is GET /v1/global/regions.
type RegionList struct {
	StateIndex uint64         `json:"state_index"`
	Regions    []RegionStatus `json:"regions"`
}

// RegionRead is GET /v1/global/regions/{region}.
type RegionRead struct {
	StateIndex uint64       `json:"state_index"`
	Region     RegionStatus `json:"region"`
	Routable   bool         `json:"routable"`
	Targets    []string     `json:"targets,omitempty"`
}

// CheckpointList is GET /v1/global/checkpoints.
type CheckpointList struct {
	StateIndex  uint64                  `json:"state_index"`
	Checkpoints map[string][]Checkpoint `json:"checkpoints"`
}

// ErrorBody is the JSON of every error answer.
type ErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// Status returns the failover picture from the local state.
func (n *Node) Status() FailoverStatus {
	return n.withLiveness(failoverStatus(n.State(), n.Health()))
}

// withLiveness adds each controller's liveness as this node sees it.
func (n *Node) withLiveness(fs FailoverStatus) FailoverStatus {
	if n.cfg.Liveness == nil {
		return fs
	}
	for i := range fs.Regions {
		r := &fs.Regions[i]
		r.Liveness = map[string]string{}
		for _, id := range r.Controllers {
			if id == n.cfg.NodeID {
				r.Liveness[id] = "alive" // the one answering
				continue
			}
			state, ok := n.cfg.Liveness(id)
			if !ok {
				state = "unknown"
			}
			r.Liveness[id] = state
		}
	}
	return fs
}

func failoverStatus(st *State, h Health) FailoverStatus {
	fs := FailoverStatus{StateIndex: st.index, Health: h}
	ctrls := map[string][]string{}
	for _, m := range st.Members() {
		ctrls[m.Region] = append(ctrls[m.Region], m.ID)
	}
	for _, r := range st.KnownRegions() {
		rs, ok := st.RegionStatus(r)
		if !ok {
			rs = RegionStatus{Region: r, State: RegionActive}
		}
		fs.Regions = append(fs.Regions, RegionView{RegionStatus: rs, Routable: st.Routable(r), Targets: st.Targets(r), Controllers: ctrls[r]})
	}
	return fs
}

const maxBody = 2*MaxPolicySize + 64<<10

// Handler returns the admin API of the global tier, to be mounted on the
// controller's admin server (paths under /v1/global/). Every request needs
// "Authorization: Bearer <AdminToken>". Writes may go to any node: they are
// forwarded to the leader. Reads answer from the local state unless
// ?consistent=1 asks for a linearizable read on the leader.
//
// Every write is a privileged action, recorded in Config.Audit by the node
// that accepted it, with the caller's certificate identity (when the
// listener serves TLS and the caller presented a certificate of the
// cluster CA) or else the admin token as its actor (RequestActor). A
// write whose record cannot be written is refused with 503
// audit_unavailable and changes nothing. Requests without the token are
// refused before any of this and not recorded: they have no identity to
// record, and recording them would let anyone fill the audit disk.
func (n *Node) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/global/health", n.getHealth)
	mux.HandleFunc("GET /v1/global/status", n.getStatus)
	mux.HandleFunc("GET /v1/global/members", n.getMembers)
	mux.HandleFunc("POST /v1/global/join", n.postJoin)
	mux.HandleFunc("DELETE /v1/global/members/{id}", n.deleteMember)
	mux.HandleFunc("POST /v1/global/apply", n.postApply)
	mux.HandleFunc("GET /v1/global/policy", n.getPolicy)
	mux.HandleFunc("POST /v1/global/policy", n.postPolicy)
	mux.HandleFunc("GET /v1/global/regions", n.getRegions)
	mux.HandleFunc("GET /v1/global/regions/{region}", n.getRegion)
	mux.HandleFunc("PUT /v1/global/regions/{region}", n.putRegion)
	mux.HandleFunc("PUT /v1/global/regions/{region}/targets", n.putTargets)
	mux.HandleFunc("GET /v1/global/failover", n.getFailover)
	mux.HandleFunc("POST /v1/global/failover/trigger", n.postTrigger)
	mux.HandleFunc("POST /v1/global/failover/recover", n.postRecover)
	mux.HandleFunc("GET /v1/global/checkpoints", n.getCheckpoints)
	mux.HandleFunc("POST /v1/global/checkpoints", n.postCheckpoint)
	mux.HandleFunc("/v1/global/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("no admin endpoint %s %s", r.Method, r.URL.Path))
	})
	want := sha256.Sum256([]byte(n.cfg.AdminToken))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		got := sha256.Sum256([]byte(tok))
		if !ok || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="meridian-admin"`)
			writeError(w, http.StatusUnauthorized, CodeUnauthorized, "missing or invalid bearer token")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		mux.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		// No leader, or closing: an election takes about a second.
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	var b ErrorBody
	b.Error.Code, b.Error.Message = code, msg
	writeJSON(w, status, b)
}

func writeErr(w http.ResponseWriter, err error) {
	code, status := codeOf(err)
	if errors.Is(err, context.DeadlineExceeded) {
		code, status = CodeTimeout, http.StatusGatewayTimeout
	}
	writeError(w, status, code, err.Error())
}

func readJSON(r *http.Request, v any) error {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("%w: request body is larger than %d bytes", ErrInvalid, mbe.Limit)
		}
		return fmt.Errorf("%w: read body: %v", ErrInvalid, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: decode JSON body: %v", ErrInvalid, err)
	}
	return nil
}

func isHop(r *http.Request) bool { return r.Header.Get(forwardedHeader) != "" }

func (n *Node) getHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, n.Health())
}

func (n *Node) getStatus(w http.ResponseWriter, r *http.Request) {
	st := n.State()
	ns := NodeStatus{Health: n.Health(), Members: st.Members()}
	if servers, err := n.Servers(); err == nil {
		ns.Servers = servers
	}
	if p, ok := st.Policy(); ok {
		p.Document = nil
		ns.Policy = &p
	}
	writeJSON(w, http.StatusOK, ns)
}

func (n *Node) getMembers(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, n.State().Members())
}

// notForwarded is the remote end of onLeader for a forwarded request,
// which is never forwarded again (onLeader answers ErrNotLeader first).
func notForwarded(context.Context, string) error { return ErrNotLeader }

// postJoin adds a member. Accepted from an operator or a joining
// controller, it is recorded here (member_join) and forwarded to the
// leader; forwarded by another controller (which recorded it), it is only
// carried out.
func (n *Node) postJoin(w http.ResponseWriter, r *http.Request) {
	hop, err := n.hopOf(r)
	if err != nil {
		writeErr(w, n.refuseRequest(r, ActionForwardedWrite, "", err))
		return
	}
	var req JoinRequest
	if err := readJSON(r, &req); err != nil {
		if !hop {
			err = n.refuseRequest(r, ActionMemberJoin, "", err)
		}
		writeErr(w, err)
		return
	}
	switch rej := validateMember(&req.Member, true); {
	case !hop:
		err = n.join(r.Context(), req, RequestActor(r))
	case rej != nil:
		err = rej
	default:
		err = n.onLeader(r.Context(), true, func(ctx context.Context) error { return n.addMember(ctx, req) }, notForwarded)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, req.Member)
}

// deleteMember removes a member, recorded (member_remove) as postJoin
// records a join.
func (n *Node) deleteMember(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	hop, err := n.hopOf(r)
	switch {
	case err != nil:
		err = n.refuseRequest(r, ActionForwardedWrite, "", err)
	case !hop:
		err = n.leave(r.Context(), id, RequestActor(r))
	case validID("member id", id) != nil:
		err = validID("member id", id)
	default:
		err = n.onLeader(r.Context(), true, func(ctx context.Context) error { return n.removeMember(ctx, id) }, notForwarded)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"removed": id})
}

// postApply is the leader's end of forwarding: an encoded command from
// another node. It answers 200 with the Result (a state machine rejection
// included) or an error status when the command could not be committed here.
// The node that accepted the write recorded it, so it is not recorded
// again; a request here that is not a hop (see hopOf) is refused, and that
// is recorded.
func (n *Node) postApply(w http.ResponseWriter, r *http.Request) {
	hop, err := n.hopOf(r)
	if err == nil && !hop {
		err = rejectf(CodeForbidden, "POST /v1/global/apply only takes writes forwarded by another controller; use the endpoint of the write")
	}
	if err != nil {
		writeErr(w, n.refuseRequest(r, ActionForwardedWrite, "", err))
		return
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		writeErr(w, fmt.Errorf("%w: read body: %v", ErrInvalid, err))
		return
	}
	c, err := decodeCommand(b)
	if err != nil {
		writeErr(w, fmt.Errorf("%w: %v", ErrInvalid, err))
		return
	}
	if c.Op == opPolicyApply && c.Policy != nil {
		// Validate again with the leader's validator: the accepting node may
		// run another version.
		declared, err := n.validatePolicy(c.Policy.Name, c.Policy.Document)
		if err != nil {
			writeErr(w, err)
			return
		}
		c.Policy.Declared = declared
	}
	res, err := n.submit(r.Context(), c, true)
	var rej *RejectedError
	if errors.As(err, &rej) {
		res.Err = rej
		writeJSON(w, http.StatusOK, res)
		return
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// consistentRead answers with read(state) from the local state, or, with
// ?consistent=1, from the leader's state after a Raft barrier (a
// linearizable read; forwarded to the leader when this node does not lead).
func (n *Node) consistentRead(w http.ResponseWriter, r *http.Request, read func(*State) (any, error)) {
	answer := func(st *State) {
		v, err := read(st)
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
	if c := r.URL.Query().Get("consistent"); c == "" || c == "0" || c == "false" {
		answer(n.State())
		return
	}
	var (
		st  *State
		raw json.RawMessage
	)
	err := n.onLeader(r.Context(), isHop(r),
		func(ctx context.Context) error {
			if err := n.raft.Barrier(n.cfg.HoldTimeout).Error(); err != nil {
				return err
			}
			st = n.State()
			return nil
		},
		func(ctx context.Context, admin string) error {
			raw = nil
			return n.forward(ctx, http.MethodGet, admin+r.URL.RequestURI(), nil, &raw)
		})
	switch {
	case err != nil:
		writeErr(w, err)
	case st != nil:
		answer(st)
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(raw)
	}
}

func (n *Node) getPolicy(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	n.consistentRead(w, r, func(st *State) (any, error) {
		if q.Get("history") != "" && q.Get("history") != "0" {
			return PolicyHistory{StateIndex: st.index, Versions: st.PolicyHistory()}, nil
		}
		if v := q.Get("version"); v != "" {
			num, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%w: version %q is not a number", ErrInvalid, v)
			}
			p, ok := st.PolicyVersion(num)
			if !ok {
				return nil, fmt.Errorf("%w: policy version %d is not kept", ErrNotFound, num)
			}
			return p, nil
		}
		p, ok := st.Policy()
		if !ok {
			return nil, fmt.Errorf("%w: no policy has been applied", ErrNotFound)
		}
		return p, nil
	})
}

// The writes below are privileged actions: each is recorded in the audit
// log (Config.Audit) with the actor RequestActor authenticated, before it
// takes effect, and refused if it cannot be; a request refused before that
// (a body that does not decode, invalid values) is recorded as refused.

func (n *Node) postPolicy(w http.ResponseWriter, r *http.Request) {
	var req PolicyRequest
	if err := readJSON(r, &req); err != nil {
		writeErr(w, n.refuseRequest(r, ActionPolicyApply, "", err))
		return
	}
	pv, err := n.ApplyPolicy(r.Context(), req.Name, []byte(req.Document), req.Reason, WriteOptions{RequestID: req.RequestID, Actor: req.Actor, By: RequestActor(r)})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, pv)
}

func (n *Node) getRegions(w http.ResponseWriter, r *http.Request) {
	n.consistentRead(w, r, func(st *State) (any, error) {
		return RegionList{StateIndex: st.index, Regions: st.Regions()}, nil
	})
}

func (n *Node) getRegion(w http.ResponseWriter, r *http.Request) {
	region := r.PathValue("region")
	n.consistentRead(w, r, func(st *State) (any, error) {
		if rej := validRegion(region); rej != nil {
			return nil, rej
		}
		rs, ok := st.RegionStatus(region)
		if !ok {
			if !st.knowsRegion(region) {
				return nil, fmt.Errorf("%w: region %q (known: %s)", ErrUnknownRegion, region, listOrNone(st.KnownRegions()))
			}
			rs = RegionStatus{Region: region, State: RegionActive}
		}
		return RegionRead{StateIndex: st.index, Region: rs, Routable: st.Routable(region), Targets: st.Targets(region)}, nil
	})
}

func (n *Node) putRegion(w http.ResponseWriter, r *http.Request) {
	var req RegionRequest
	if err := readJSON(r, &req); err != nil {
		writeErr(w, n.refuseRequest(r, ActionRegionSet, r.PathValue("region"), err))
		return
	}
	res, err := n.SetRegionState(r.Context(), RegionChange{
		Region: r.PathValue("region"), State: req.State, Reason: req.Reason, Expect: req.Expect, Force: req.Force,
	}, WriteOptions{RequestID: req.RequestID, Actor: req.Actor, By: RequestActor(r)})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (n *Node) putTargets(w http.ResponseWriter, r *http.Request) {
	var req TargetsRequest
	if err := readJSON(r, &req); err != nil {
		writeErr(w, n.refuseRequest(r, ActionFailoverTargets, r.PathValue("region"), err))
		return
	}
	res, err := n.SetTargets(r.Context(), r.PathValue("region"), req.Targets, WriteOptions{RequestID: req.RequestID, Actor: req.Actor, By: RequestActor(r)})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (n *Node) getFailover(w http.ResponseWriter, r *http.Request) {
	h := n.Health()
	n.consistentRead(w, r, func(st *State) (any, error) { return n.withLiveness(failoverStatus(st, h)), nil })
}

func (n *Node) postTrigger(w http.ResponseWriter, r *http.Request) {
	var req FailoverRequest
	if err := readJSON(r, &req); err != nil {
		writeErr(w, n.refuseRequest(r, ActionFailoverTrigger, "", err))
		return
	}
	to := RegionFailed
	if req.Drain {
		to = RegionDraining
	}
	res, err := n.SetRegionState(r.Context(), RegionChange{Region: req.Region, State: to, Reason: req.Reason, Force: req.Force},
		WriteOptions{RequestID: req.RequestID, Actor: req.Actor, By: RequestActor(r)})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (n *Node) postRecover(w http.ResponseWriter, r *http.Request) {
	var req FailoverRequest
	if err := readJSON(r, &req); err != nil {
		writeErr(w, n.refuseRequest(r, ActionFailoverRecover, "", err))
		return
	}
	if req.Drain {
		writeErr(w, n.refuseRequest(r, ActionFailoverRecover, req.Region, fmt.Errorf("%w: drain is only valid for trigger", ErrInvalid)))
		return
	}
	res, err := n.SetRegionState(r.Context(), RegionChange{Region: req.Region, State: RegionActive, Reason: req.Reason, Force: req.Force},
		WriteOptions{RequestID: req.RequestID, Actor: req.Actor, By: RequestActor(r)})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (n *Node) getCheckpoints(w http.ResponseWriter, r *http.Request) {
	ctrl := r.URL.Query().Get("controller")
	n.consistentRead(w, r, func(st *State) (any, error) {
		out := CheckpointList{StateIndex: st.index, Checkpoints: map[string][]Checkpoint{}}
		for _, c := range st.CheckpointControllers() {
			if ctrl == "" || c == ctrl {
				out.Checkpoints[c] = st.Checkpoints(c)
			}
		}
		if ctrl != "" && len(out.Checkpoints) == 0 {
			return nil, fmt.Errorf("%w: no checkpoints of controller %q", ErrNotFound, ctrl)
		}
		return out, nil
	})
}

// postCheckpoint anchors a checkpoint sent to the admin API (the
// controllers' own go through AppendCheckpoint, unrecorded): an operator
// could anchor a forged chain head this way, so it is recorded.
func (n *Node) postCheckpoint(w http.ResponseWriter, r *http.Request) {
	var req CheckpointRequest
	if err := readJSON(r, &req); err != nil {
		writeErr(w, n.refuseRequest(r, ActionCheckpointAppend, "", err))
		return
	}
	o := WriteOptions{RequestID: req.RequestID, Actor: req.Actor, By: RequestActor(r)}.withRequestID()
	cp := req.Checkpoint
	act := n.action(ActionCheckpointAppend, o, "", map[string]string{
		"controller": cp.ControllerID, "segment": cp.Segment, "sequence": strconv.FormatUint(cp.Sequence, 10), "head": cp.HeadHash})
	if rej := validateCheckpoint(&cp); rej != nil {
		writeErr(w, n.admin().Refuse(r.Context(), act, rej))
		return
	}
	var res Result
	err := n.admin().Run(r.Context(), act, func(ctx context.Context) (err error) {
		res, err = n.AppendCheckpoint(ctx, cp, o)
		return err
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
