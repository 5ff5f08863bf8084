package global

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
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

// reconcile runs on the leader: it makes sure the leader's own member record
// is current (the others forward to it by that record) and promotes caught-up
// non-voters while there are fewer voters than Config.Voters (keeping the
// count odd).
func (n *Node) reconcile(ctx context.Context) error {
	// Both changes are the node's own (auth internal) and recorded in
	// Config.Audit before they are made, like an operator's: one that
	// cannot be recorded is not made, and is tried again next time.
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
	voters := 0
	for _, s := range servers {
		if s.Suffrage == "voter" {
			voters++
		}
	}
	// Keep an odd number of voters: 4 voters tolerate no more failures than
	// 3, and need a larger quorum.
	want := min(n.cfg.Voters, len(servers))
	if want%2 == 0 {
		want--
	}
	for _, s := range servers {
		if voters >= want {
			return nil
		}
		if s.Suffrage == "voter" {
			continue
		}
		ok, why := n.caughtUp(ctx, s.ID)
		if !ok {
			n.log.Debug("non-voter not promoted yet", "member", s.ID, "why", why)
			continue
		}
		m, _ := n.State().Member(s.ID)
		act := n.action(ActionMemberPromote, WriteOptions{}, m.Region, map[string]string{"member": s.ID, "raft_addr": s.Address})
		err := n.admin().Run(ctx, act, func(context.Context) error {
			return n.raft.AddVoter(raft.ServerID(s.ID), raft.ServerAddress(s.Address), 0, n.cfg.HoldTimeout).Error()
		})
		if err != nil {
			return fmt.Errorf("promote %s: %w", s.ID, err)
		}
		voters++
		n.log.Info("non-voter promoted to voter", "member", s.ID, "voters", voters)
	}
	return nil
}

// caughtUp asks a non-voter's admin API how far it has applied and whether
// it hears the leader.
func (n *Node) caughtUp(ctx context.Context, id string) (bool, string) {
	m, ok := n.State().Member(id)
	if !ok {
		return false, "no member record (admin address unknown)"
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ReconcileInterval)
	defer cancel()
	c := NewClient(m.AdminAddr, n.cfg.AdminToken, n.httpc)
	c.Retries = 0
	h, err := c.Health(ctx)
	if err != nil {
		return false, err.Error()
	}
	commit := n.raft.CommitIndex()
	if h.AppliedIndex+n.cfg.PromoteMaxLag < commit {
		return false, fmt.Sprintf("applied %d, leader commit %d", h.AppliedIndex, commit)
	}
	if h.Stale {
		return false, "no recent contact with the leader"
	}
	return true, ""
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
