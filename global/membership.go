package global

import (
	"context"
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
	known := false
	if f := n.raft.GetConfiguration(); f.Error() == nil {
		for _, s := range f.Configuration().Servers {
			known = known || string(s.ID) == m.ID
		}
	}
	if err := n.raft.AddNonvoter(raft.ServerID(m.ID), raft.ServerAddress(m.RaftAddr), 0, n.cfg.HoldTimeout).Error(); err != nil {
		return fmt.Errorf("add non-voter %s: %w", m.ID, err)
	}
	if !known {
		n.changed("add", m.ID, m.Region, "join:"+m.ID, "joined as a non-voter (raft "+m.RaftAddr+")")
	}
	return nil
}

// Leave removes a controller from the Raft configuration and the member list
// (through the leader). The removed node keeps running with its last state.
func (n *Node) Leave(ctx context.Context, id string) error {
	if rej := validID("member id", id); rej != nil {
		return rej
	}
	err := n.onLeader(ctx, false,
		func(ctx context.Context) error { return n.removeReported(ctx, id, "admin", "removed by Leave") },
		func(ctx context.Context, admin string) error {
			return n.forward(ctx, http.MethodDelete, admin+"/v1/global/members/"+id, nil, nil)
		})
	if err != nil {
		return fmt.Errorf("remove member %s: %w", id, err)
	}
	return nil
}

// removeReported removes a member on the leader and reports the change.
func (n *Node) removeReported(ctx context.Context, id, actor, reason string) error {
	region := n.memberRegion(id)
	if err := n.removeMember(ctx, id); err != nil {
		return err
	}
	n.changed("remove", id, region, actor, reason)
	return nil
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

// MembershipChange is one change of the Raft configuration the leader
// made, for the audit log (Config.OnMembershipChange).
type MembershipChange struct {
	// Op is "add" (a joining member, as a non-voter), "promote",
	// "demote" or "remove".
	Op     string
	Member string
	Region string // the member's region ("" when unknown)
	// Actor is who asked: "join:<id>" for a join, "leader:<id>" for the
	// leader's own placement, or the admin caller for a removal.
	Actor  string
	Reason string
	// Leader and LeaderRegion made the change; At is when.
	Leader       string
	LeaderRegion string
	At           time.Time
}

// changed reports a membership change: logged, counted, and handed to
// Config.OnMembershipChange.
func (n *Node) changed(op, member, region, actor, reason string) {
	ch := MembershipChange{Op: op, Member: member, Region: region, Actor: actor, Reason: reason,
		Leader: n.cfg.NodeID, LeaderRegion: n.cfg.Region, At: n.now()}
	n.m.membershipChanges.WithLabelValues(op).Inc()
	n.log.Info("raft membership changed", "op", op, "member", member, "region", region, "actor", actor, "reason", reason)
	if n.cfg.OnMembershipChange != nil {
		n.cfg.OnMembershipChange(ch)
	}
}

// memberRegion is a member's region ("" when it has no record).
func (n *Node) memberRegion(id string) string {
	m, _ := n.State().Member(id)
	return m.Region
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
// members down for RemoveDownAfter. Each change is reported (changed).
func (n *Node) reconcile(ctx context.Context, health *memberHealth) error {
	if n.membershipStale() {
		self := n.self()
		c := &command{Op: opMemberUpsert, Actor: "leader:" + self.ID, Member: &self}
		if _, err := n.submit(ctx, c, true); err != nil {
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
	for _, s := range servers {
		c := voterCandidate{ID: s.ID, Voter: s.Suffrage == "voter"}
		if m, ok := st.Member(s.ID); ok {
			c.Region = m.Region
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
	addr := map[string]string{}
	for _, s := range servers {
		addr[s.ID] = s.Address
	}
	actor := "leader:" + n.cfg.NodeID
	for _, id := range plan.Promote {
		if err := n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr[id]), 0, n.cfg.HoldTimeout).Error(); err != nil {
			return fmt.Errorf("promote %s: %w", id, err)
		}
		n.changed("promote", id, n.memberRegion(id), actor, fmt.Sprintf("voter placement: %d voters wanted, at most %d per region", plan.Want,
			perRegionCap(regionsOf(cands), n.cfg.Voters, n.cfg.VotersPerRegion)))
	}
	for _, id := range plan.Demote {
		reason := "voter placement: over its region's cap, or more voters than wanted"
		if since := now.Sub(health.lastSeen(id)); since > n.cfg.VoterDownAfter {
			reason = fmt.Sprintf("down for %v (voter_down_after %v): replaced", since.Round(time.Second), n.cfg.VoterDownAfter)
		}
		if err := n.raft.DemoteVoter(raft.ServerID(id), 0, n.cfg.HoldTimeout).Error(); err != nil {
			return fmt.Errorf("demote %s: %w", id, err)
		}
		n.changed("demote", id, n.memberRegion(id), actor, reason)
	}
	if n.cfg.RemoveDownAfter > 0 {
		for _, c := range cands {
			if c.Leader || c.Voter {
				continue // a voter is demoted first (and only once replaced)
			}
			if since := now.Sub(health.lastSeen(c.ID)); since > n.cfg.RemoveDownAfter {
				reason := fmt.Sprintf("down for %v (remove_down_after %v)", since.Round(time.Second), n.cfg.RemoveDownAfter)
				if err := n.removeReported(ctx, c.ID, actor, reason); err != nil {
					return fmt.Errorf("remove %s: %w", c.ID, err)
				}
			}
		}
	}
	return nil
}

func regionsOf(cands []voterCandidate) int {
	seen := map[string]bool{}
	for _, c := range cands {
		if c.Region != "" {
			seen[c.Region] = true
		}
	}
	return len(seen)
}

// memberCheck is the leader's health check of one member.
type memberCheck struct {
	answered bool   // its admin API answered
	caughtUp bool   // applied within PromoteMaxLag and hearing the leader
	why      string // why not
}

// checkMembers checks every other member's health, in parallel, each
// within ReconcileInterval.
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
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ReconcileInterval)
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
