package global

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/global/identity"
)

// AuditLog is where a node records privileged actions (Config.Audit): the
// controller's audit log.
type AuditLog interface {
	Append(ctx context.Context, e audit.Entry) error
}

// ActorAdminToken is the actor of a request authenticated by the admin
// bearer token alone: the cluster has one token, and this is its name.
const ActorAdminToken = "admin-token"

// The actions recorded (audit.AdminDetail.Action).
const (
	ActionPolicyApply      = "policy_apply"
	ActionFailoverTrigger  = "failover_trigger" // a region to failed or draining
	ActionFailoverRecover  = "failover_recover" // a region to recovering or active
	ActionRegionSet        = "region_set"       // PUT /v1/global/regions/{region} with a body that does not decode
	ActionFailoverTargets  = "failover_targets"
	ActionMemberJoin       = "member_join"
	ActionMemberRemove     = "member_remove"
	ActionMemberUpdate     = "member_update"  // the leader records its own addresses
	ActionMemberPromote    = "member_promote" // the leader makes a caught-up non-voter a voter
	ActionMemberDemote     = "member_demote"  // the leader takes a voter's vote (placement across regions, or silent)
	ActionCheckpointAppend = "checkpoint_append"
	// ActionForwardedWrite is a request that claims to be forwarded by
	// another controller and is refused because it is not.
	ActionForwardedWrite = "forwarded_write"
)

// Actor is who asks for a privileged action, as authenticated.
type Actor struct {
	// Name is a certificate identity URI, ActorAdminToken, or
	// "controller:<id>" for the controller itself.
	Name string
	// Auth is audit.AuthCertificate, audit.AuthToken or audit.AuthInternal.
	Auth string
}

// RequestActor returns the actor of an admin request that passed the
// bearer token check: the identity of its client certificate when it
// presented one the TLS stack verified against the cluster CA (an
// operator's, a controller's), else the admin token.
func RequestActor(r *http.Request) Actor {
	if id, ok := identity.FromRequest(r); ok {
		return Actor{Name: id.String(), Auth: audit.AuthCertificate}
	}
	return Actor{Name: ActorAdminToken, Auth: audit.AuthToken}
}

// selfActor is the node acting on its own.
func (n *Node) selfActor() Actor {
	return Actor{Name: "controller:" + n.cfg.NodeID, Auth: audit.AuthInternal}
}

// admin is the recorder of privileged actions (it records nothing without
// Config.Audit).
func (n *Node) admin() audit.Admin {
	if n.cfg.Audit == nil {
		return audit.Admin{}
	}
	return audit.Admin{Log: n.cfg.Audit, Origin: n.cfg.Region}
}

// action describes a privileged action asked for with o (o.By, or the node
// itself) on region ("" for none). The actor the request named itself
// (WriteOptions.Actor, unverified) is kept as the argument claimed_actor.
func (n *Node) action(name string, o WriteOptions, region string, args map[string]string) audit.AdminAction {
	by := o.By
	if by.Name == "" {
		by = n.selfActor()
	}
	if args == nil {
		args = map[string]string{}
	}
	if o.Actor != "" {
		args["claimed_actor"] = o.Actor
	}
	return audit.AdminAction{Action: name, Actor: by.Name, Auth: by.Auth, RequestID: o.RequestID, Region: region,
		PolicyVersion: n.State().PolicyVersionString(), Args: args}
}

// refuseRequest records an admin request refused before it could be read
// (a body that does not decode, a forged hop) and returns err.
func (n *Node) refuseRequest(r *http.Request, name, region string, err error) error {
	return n.admin().Refuse(r.Context(), n.action(name, WriteOptions{By: RequestActor(r)}, region,
		map[string]string{"method": r.Method, "path": r.URL.Path}), err)
}

// hopOf reports whether r was forwarded by another controller: it carries
// the X-Meridian-Forwarded header. A forwarded write is not recorded again
// (the controller that accepted it recorded it, with its actor), so over
// TLS the header is believed only from a member controller's certificate,
// naming that controller: an operator, or anyone else with the admin
// token, cannot skip the record by adding the header. Without TLS (a
// loopback cluster, or the insecure opt-out, where Raft itself is open to
// whoever reaches it) the header is believed on the admin token.
func (n *Node) hopOf(r *http.Request) (bool, error) {
	from := r.Header.Get(forwardedHeader)
	if from == "" {
		return false, nil
	}
	if r.TLS == nil {
		return true, nil
	}
	id, ok := identity.FromRequest(r)
	if !ok || !id.IsController() {
		return true, rejectf(CodeForbidden, "a request forwarded by %q must come with a controller certificate of the cluster", from)
	}
	if id.ControllerID != from {
		return true, rejectf(CodeForbidden, "a request forwarded by %q came with the certificate of controller %q", from, id.ControllerID)
	}
	if _, member := n.State().Member(id.ControllerID); !member {
		return true, rejectf(CodeForbidden, "controller %q forwarded a request but is not a member of the cluster", id.ControllerID)
	}
	return true, nil
}

// regionAction names a region state change.
func regionAction(to RegionState) string {
	if to == RegionFailed || to == RegionDraining {
		return ActionFailoverTrigger
	}
	return ActionFailoverRecover
}

func regionArgs(ch RegionChange) map[string]string {
	a := map[string]string{"state": ch.State.String(), "force": strconv.FormatBool(ch.Force)}
	if ch.Expect != nil {
		a["expect"] = ch.Expect.String()
	}
	if ch.Automatic {
		a["automatic"] = "true"
	}
	if ch.Reason != "" {
		a["reason"] = ch.Reason
	}
	return a
}

func memberArgs(m Member) map[string]string {
	return map[string]string{"member": m.ID, "raft_addr": m.RaftAddr, "admin_addr": m.AdminAddr}
}

// withRequestID gives o a request id, so that its audit record and its
// Raft command carry the same.
func (o WriteOptions) withRequestID() WriteOptions {
	if o.RequestID == "" {
		o.RequestID = NewRequestID()
	}
	return o
}

// stamp fills in a command's version, request id and time, and validates
// it (before it is recorded, so that a malformed write is refused, not
// recorded as applied). submit stamps again; it changes nothing then.
func (n *Node) stamp(c *command) *RejectedError {
	c.V = commandVersion
	if c.RequestID == "" {
		c.RequestID = NewRequestID()
	}
	if c.At == 0 {
		c.At = n.now().UnixNano()
	}
	return c.validate()
}

// errorf wraps err as fmt.Errorf(format+": %w") unless it is nil.
func errorf(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}
