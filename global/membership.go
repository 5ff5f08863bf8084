package global

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// JoinRequest asks the leader to add a controller to the group.
type JoinRequest struct {
	Member    Member `json:"member"`
	RequestID string `json:"request_id,omitempty"`
}

// Server is one server of the Raft configuration.
type Server struct {
	ID       string `json:"id"`
	Address  string `json:"address"`
	Suffrage string `json:"suffrage"` // "voter" or "nonvoter"
}

// Join asks the cluster, through the admin API at any of addrs, to add this
// node (as a non-voter, promoted by the leader once caught up). It tries each
// address in turn and returns the last error if none accepted.
func (n *Node) Join(ctx context.Context, addrs ...string) error {
	if len(addrs) == 0 {
		return fmt.Errorf("join: %w: no admin address given", ErrInvalid)
	}
	req := JoinRequest{Member: n.self(), RequestID: NewRequestID()}
	var errs []error
	for _, a := range addrs {
		c := NewClient(a, n.cfg.AdminToken, n.httpc)
		c.Retries = 0
		if err := c.Join(ctx, req); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a, err))
			continue
		}
		return nil
	}
	return fmt.Errorf("join: %w", errors.Join(errs...))
}

// joinLoop joins at Open time and retries until it succeeds or the node
// closes (the cluster may not be up yet).
func (n *Node) joinLoop() {
	defer n.wg.Done()
	backoff := 50 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(n.ctx, n.cfg.HoldTimeout+time.Second)
		err := n.Join(ctx, n.cfg.Join...)
		cancel()
		if err == nil {
			n.log.Info("joined the global tier", "via", n.cfg.Join)
			return
		}
		if n.ctx.Err() != nil {
			return
		}
		n.log.Warn("join failed; retrying", "err", err, "in", backoff)
		select {
		case <-n.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// addMember runs on the leader: record the member, then add it to Raft as a
// non-voter (a voter keeps its suffrage; only its address is updated).
func (n *Node) addMember(ctx context.Context, req JoinRequest) error {
	m := req.Member
	m.Since, m.Index = time.Time{}, 0
	c := &command{Op: opMemberUpsert, RequestID: req.RequestID, Actor: "join:" + m.ID, Member: &m}
	if c.RequestID == "" {
		c.RequestID = NewRequestID()
	}
	if _, err := n.submit(ctx, c, true); err != nil {
		return err
	}
	if err := n.raft.AddNonvoter(raft.ServerID(m.ID), raft.ServerAddress(m.RaftAddr), 0, n.cfg.HoldTimeout).Error(); err != nil {
		return fmt.Errorf("add non-voter %s: %w", m.ID, err)
	}
	n.log.Info("member added as non-voter", "member", m.ID, "member_region", m.Region, "raft_addr", m.RaftAddr)
	return nil
}

// Leave removes a controller from the Raft configuration and the member list
// (through the leader). The removed node keeps running with its last state.
// The removal is recorded in Config.Audit (member_remove, by the node
// itself) before it is made, and refused if it cannot be.
func (n *Node) Leave(ctx context.Context, id string) error {
	return n.leave(ctx, id, n.selfActor())
}

// leave removes member id for by, recording it first.
func (n *Node) leave(ctx context.Context, id string, by Actor) error {
	region := ""
	if m, ok := n.State().Member(id); ok {
		region = m.Region
	}
	act := n.action(ActionMemberRemove, WriteOptions{By: by}, region, map[string]string{"member": id})
	if rej := validID("member id", id); rej != nil {
		return n.admin().Refuse(ctx, act, rej)
	}
	return n.admin().Run(ctx, act, func(ctx context.Context) error {
		err := n.onLeader(ctx, false,
			func(ctx context.Context) error { return n.removeMember(ctx, id) },
			func(ctx context.Context, admin string) error {
				return n.forward(ctx, http.MethodDelete, admin+"/v1/global/members/"+id, nil, nil)
			})
		return errorf(err, "remove member %s", id)
	})
}

// join adds the member of req for by (on the leader, or forwarded to it),
// recording it first.
func (n *Node) join(ctx context.Context, req JoinRequest, by Actor) error {
	if req.RequestID == "" {
		req.RequestID = NewRequestID()
	}
	act := n.action(ActionMemberJoin, WriteOptions{By: by, RequestID: req.RequestID}, req.Member.Region, memberArgs(req.Member))
	if rej := validateMember(&req.Member, true); rej != nil {
		return n.admin().Refuse(ctx, act, rej)
	}
	body, _ := json.Marshal(req)
	return n.admin().Run(ctx, act, func(ctx context.Context) error {
		return n.onLeader(ctx, false,
			func(ctx context.Context) error { return n.addMember(ctx, req) },
			func(ctx context.Context, admin string) error {
				return n.forward(ctx, http.MethodPost, admin+"/v1/global/join", body, nil)
			})
	})
}

func (n *Node) removeMember(ctx context.Context, id string) error {
	if err := n.raft.RemoveServer(raft.ServerID(id), 0, n.cfg.HoldTimeout).Error(); err != nil {
		return fmt.Errorf("remove server: %w", err)
	}
	c := &command{Op: opMemberRemove, Actor: "leave", Member: &Member{ID: id}}
	_, err := n.submit(ctx, c, true)
	return err
}

// Servers returns the Raft configuration as this node knows it.
func (n *Node) Servers() ([]Server, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("raft configuration: %w", err)
	}
	var out []Server
	for _, s := range f.Configuration().Servers {
		suf := "voter"
		if s.Suffrage != raft.Voter {
			suf = "nonvoter"
		}
		out = append(out, Server{ID: string(s.ID), Address: string(s.Address), Suffrage: suf})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// memberHealth is what the leader has seen of each member's health since
// it began leading.
type memberHealth struct {
	since time.Time            // leadership began: members not heard yet count from here
	seen  map[string]time.Time // last answer to a health check
}

func newMemberHealth(now time.Time) *memberHealth {
	return &memberHealth{since: now, seen: map[string]time.Time{}}
}

// lastSeen is when the member last answered (or when leadership began).
func (h *memberHealth) lastSeen(id string) time.Time {
	if t, ok := h.seen[id]; ok {
		return t
	}
	return h.since
}

// reconcile runs on the leader every ReconcileInterval: it makes sure the
// leader's own member record is current (the others forward to it by that
// record), checks every member's health, places the voters across regions
// (planVoters: promotions first, demotions in a later round) and removes
// members silent for RemoveDownAfter. Every change is the node's own (auth
// internal) and recorded in Config.Audit before it is made, like an
// operator's: one that cannot be recorded is not made, and is tried again
// next time.
func (n *Node) reconcile(ctx context.Context, health *memberHealth) error {
	if n.membershipStale() {
		self := n.self()
		c := &command{Op: opMemberUpsert, Actor: "leader:" + self.ID, Member: &self}
		err := n.admin().Run(ctx, n.action(ActionMemberUpdate, WriteOptions{}, self.Region, memberArgs(self)), func(ctx context.Context) error {
			_, err := n.submit(ctx, c, true)
			return err
		})
		if err != nil {
			return fmt.Errorf("record own membership: %w", err)
		}
	}
	servers, err := n.Servers()
	if err != nil {
		return err
	}
	now := n.now()
	checks := n.checkMembers(ctx, servers)
	st := n.State()
	cands := make([]voterCandidate, 0, len(servers))
	addr := map[string]string{}
	regions := map[string]bool{}
	for _, s := range servers {
		addr[s.ID] = s.Address
		c := voterCandidate{ID: s.ID, Voter: s.Suffrage == "voter"}
		if m, ok := st.Member(s.ID); ok {
			c.Region = m.Region
			regions[m.Region] = true
		}
		if s.ID == n.cfg.NodeID {
			c.Leader, c.Up, c.CaughtUp = true, true, true
		} else {
			ck := checks[s.ID]
			if ck.answered {
				health.seen[s.ID] = now
			}
			c.Up = now.Sub(health.lastSeen(s.ID)) <= n.cfg.VoterDownAfter
			c.CaughtUp = ck.caughtUp
			if !ck.caughtUp {
				n.log.Debug("member not caught up", "member", s.ID, "why", ck.why)
			}
		}
		cands = append(cands, c)
	}
	plan := planVoters(cands, n.cfg.Voters, n.cfg.VotersPerRegion)
	regionOf := func(id string) string { m, _ := st.Member(id); return m.Region }
	for _, id := range plan.Promote {
		reason := fmt.Sprintf("voter placement: %d voters wanted, at most %d per region", plan.Want,
			perRegionCap(len(regions), n.cfg.Voters, n.cfg.VotersPerRegion))
		act := n.action(ActionMemberPromote, WriteOptions{}, regionOf(id), map[string]string{"member": id, "raft_addr": addr[id], "reason": reason})
		err := n.admin().Run(ctx, act, func(context.Context) error {
			return n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr[id]), 0, n.cfg.HoldTimeout).Error()
		})
		if err != nil {
			return fmt.Errorf("promote %s: %w", id, err)
		}
		n.m.membershipChanges.WithLabelValues("promote").Inc()
		n.log.Info("non-voter promoted to voter", "member", id, "reason", reason)
	}
	for _, id := range plan.Demote {
		reason := "voter placement: over its region's cap, or more voters than wanted"
		if since := now.Sub(health.lastSeen(id)); since > n.cfg.VoterDownAfter {
			reason = fmt.Sprintf("silent for %v (voter_down_after %v): replaced", since.Round(time.Second), n.cfg.VoterDownAfter)
		}
		act := n.action(ActionMemberDemote, WriteOptions{}, regionOf(id), map[string]string{"member": id, "reason": reason})
		err := n.admin().Run(ctx, act, func(context.Context) error {
			return n.raft.DemoteVoter(raft.ServerID(id), 0, n.cfg.HoldTimeout).Error()
		})
		if err != nil {
			return fmt.Errorf("demote %s: %w", id, err)
		}
		n.m.membershipChanges.WithLabelValues("demote").Inc()
		n.log.Info("voter demoted", "member", id, "reason", reason)
	}
	if n.cfg.RemoveDownAfter > 0 {
		for _, c := range cands {
			if c.Leader || c.Voter {
				continue // a voter is demoted first (and only once replaced)
			}
			since := now.Sub(health.lastSeen(c.ID))
			if since <= n.cfg.RemoveDownAfter {
				continue
			}
			reason := fmt.Sprintf("silent for %v (remove_down_after %v)", since.Round(time.Second), n.cfg.RemoveDownAfter)
			act := n.action(ActionMemberRemove, WriteOptions{}, c.Region, map[string]string{"member": c.ID, "reason": reason})
			if err := n.admin().Run(ctx, act, func(ctx context.Context) error { return n.removeMember(ctx, c.ID) }); err != nil {
				return fmt.Errorf("remove %s: %w", c.ID, err)
			}
			n.m.membershipChanges.WithLabelValues("remove").Inc()
			n.log.Info("silent member removed", "member", c.ID, "reason", reason)
		}
	}
	return nil
}

// memberCheckTimeout bounds one health check: the reconcile interval, but
// at least a second (a loaded member, or leader, must not look silent
// because a check of a few milliseconds waited for a CPU) and at most
// VoterDownAfter.
func (n *Node) memberCheckTimeout() time.Duration {
	return min(max(n.cfg.ReconcileInterval, time.Second), n.cfg.VoterDownAfter)
}

// memberCheck is the leader's health check of one member.
type memberCheck struct {
	answered bool   // its admin API answered
	caughtUp bool   // applied within PromoteMaxLag and hearing the leader
	why      string // why not
}

// checkMembers checks every other member's health, in parallel, each
// within memberCheckTimeout.
func (n *Node) checkMembers(ctx context.Context, servers []Server) map[string]memberCheck {
	out := make(map[string]memberCheck, len(servers))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, s := range servers {
		if s.ID == n.cfg.NodeID {
			continue
		}
		wg.Go(func() {
			ck := n.checkMember(ctx, s.ID)
			mu.Lock()
			out[s.ID] = ck
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// checkMember asks a member's admin API how far it has applied and
// whether it hears the leader.
func (n *Node) checkMember(ctx context.Context, id string) memberCheck {
	m, ok := n.State().Member(id)
	if !ok {
		return memberCheck{why: "no member record (admin address unknown)"}
	}
	ctx, cancel := context.WithTimeout(ctx, n.memberCheckTimeout())
	defer cancel()
	c := NewClient(m.AdminAddr, n.cfg.AdminToken, n.httpc)
	c.Retries = 0
	h, err := c.Health(ctx)
	if err != nil {
		return memberCheck{why: err.Error()}
	}
	commit := n.raft.CommitIndex()
	switch {
	case h.AppliedIndex+n.cfg.PromoteMaxLag < commit:
		return memberCheck{answered: true, why: fmt.Sprintf("applied %d, leader commit %d", h.AppliedIndex, commit)}
	case h.Stale:
		return memberCheck{answered: true, why: "no recent contact with the leader"}
	}
	return memberCheck{answered: true, caughtUp: true}
}

// TransferLeadership asks the leader (this node) to hand leadership to the
// voter to ("" for the most up-to-date voter), e.g. to keep the leader in a
// central region. It fails with ErrNotLeader on a follower.
func (n *Node) TransferLeadership(to string) error {
	if n.raft.State() != raft.Leader {
		return fmt.Errorf("transfer leadership: %w", ErrNotLeader)
	}
	var f raft.Future
	if to == "" {
		f = n.raft.LeadershipTransfer()
	} else {
		servers, err := n.Servers()
		if err != nil {
			return fmt.Errorf("transfer leadership: %w", err)
		}
		i := slices.IndexFunc(servers, func(s Server) bool { return s.ID == to })
		if i < 0 || servers[i].Suffrage != "voter" {
			return fmt.Errorf("transfer leadership: %w: %q is not a voter", ErrInvalid, to)
		}
		f = n.raft.LeadershipTransferToServer(raft.ServerID(to), raft.ServerAddress(servers[i].Address))
	}
	if err := f.Error(); err != nil {
		return fmt.Errorf("transfer leadership: %w", err)
	}
	return nil
}
