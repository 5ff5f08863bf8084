package audit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"
)

// KindAdminAction is a privileged action on the control plane that a
// controller handled: a policy apply, a failover trigger or recover, a
// membership change, a gossip key rotation step. Its "cost" member holds the
// action's AdminDetail instead of a cost breakdown.
const KindAdminAction Kind = "admin_action"

// Outcomes of an admin action (AdminDetail.Outcome).
const (
	// OutcomeApplied: the action passed every check and was carried out
	// right after this record became durable. If carrying it out then
	// failed, a record of the same decision id with OutcomeFailed follows.
	OutcomeApplied = "applied"
	// OutcomeRefused: the action was refused before anything changed
	// (invalid input, a policy the validator rejects, a failover that would
	// strand traffic, a key this controller refuses, ...); Error says why.
	OutcomeRefused = "refused"
	// OutcomeFailed: carrying out an action recorded as applied failed;
	// Error says how far it got (a Raft write without a leader may still
	// commit later; a key operation stays applied on the controllers that
	// answered).
	OutcomeFailed = "failed"
)

// How the actor of an admin action was authenticated (AdminDetail.Auth).
const (
	// AuthCertificate: the caller presented a client certificate of the
	// cluster CA; Actor is its identity URI.
	AuthCertificate = "certificate"
	// AuthToken: the caller presented the admin bearer token and no
	// certificate; Actor is the token's name.
	AuthToken = "token"
	// AuthInternal: the controller acted on its own (automatic failover,
	// membership reconciliation, the bootstrap policy of its
	// configuration); Actor names the controller.
	AuthInternal = "internal"
)

// maxAdminError bounds AdminDetail.Error; longer errors are cut.
const maxAdminError = 1024

// AdminRecordTimeout bounds the write of one admin record. The write does
// not end with the caller's context: a caller that goes away while its
// action is being recorded must not leave an applied record of an action
// that was then not carried out.
const AdminRecordTimeout = 5 * time.Second

// AdminDetail is what an admin_action record says about the action, stored
// canonically in its "cost" member. The other members of the record carry
// the rest: decision_id (one id per action; a failed record repeats the
// applied record's), request_id (the Raft write's idempotency id, when
// there is one), origin (the region of the controller that handled it, whose
// chain holds the record), region (the region the action targets, if any)
// and policy_version (the policy in force on that controller when it
// handled the action).
type AdminDetail struct {
	// Action names what was asked: policy_apply, failover_trigger,
	// failover_recover, region_set, failover_targets, member_join,
	// member_remove, member_update, member_promote, member_demote,
	// checkpoint_append,
	// forwarded_write, gossip_key_install, gossip_key_use,
	// gossip_key_remove.
	Action string `json:"action"`
	// Actor is who asked: a certificate identity
	// (spiffe://meridian/client/alice), the admin token's name
	// ("admin-token"), or the controller itself.
	Actor string `json:"actor"`
	// Auth is how the actor was authenticated (AuthCertificate, AuthToken,
	// AuthInternal).
	Auth string `json:"auth"`
	// Outcome is OutcomeApplied, OutcomeRefused or OutcomeFailed.
	Outcome string `json:"outcome"`
	// Error says why the action was refused or failed.
	Error string `json:"error,omitempty"`
	// Args are the target and arguments: a policy's name, declared version
	// and SHA-256, a region's new state, a member id, a key fingerprint.
	// Never key material or tokens.
	Args map[string]string `json:"args,omitempty"`
}

func (d *AdminDetail) validate() error {
	switch {
	case d.Action == "" || len(d.Action) > MaxFieldBytes:
		return fmt.Errorf("action %q must be 1-%d bytes", d.Action, MaxFieldBytes)
	case d.Actor == "" || len(d.Actor) > MaxFieldBytes:
		return fmt.Errorf("actor %q must be 1-%d bytes", d.Actor, MaxFieldBytes)
	case d.Auth != AuthCertificate && d.Auth != AuthToken && d.Auth != AuthInternal:
		return fmt.Errorf("auth %q is not one of %s, %s, %s", d.Auth, AuthCertificate, AuthToken, AuthInternal)
	case d.Outcome != OutcomeApplied && d.Outcome != OutcomeRefused && d.Outcome != OutcomeFailed:
		return fmt.Errorf("outcome %q is not one of %s, %s, %s", d.Outcome, OutcomeApplied, OutcomeRefused, OutcomeFailed)
	case d.Outcome != OutcomeApplied && d.Error == "":
		return fmt.Errorf("a %s action carries its error", d.Outcome)
	}
	return nil
}

// checkAdminCost checks the canonical cost member of an admin_action entry.
func checkAdminCost(cost []byte) error {
	var d AdminDetail
	if err := json.Unmarshal(cost, &d); err != nil {
		return fmt.Errorf("not an admin action detail: %v", err)
	}
	return d.validate()
}

// Admin returns the detail of an admin_action record (false for other
// kinds, or a detail that does not decode).
func (r *Record) Admin() (AdminDetail, bool) {
	var d AdminDetail
	if r.Kind != KindAdminAction || json.Unmarshal(r.Cost, &d) != nil {
		return AdminDetail{}, false
	}
	return d, true
}

// AdminAction describes one privileged action to record.
type AdminAction struct {
	// ID is the record's decision_id; empty: a random one. Every record of
	// the action shares it.
	ID string
	// Action, Actor and Auth: see AdminDetail.
	Action string
	Actor  string
	Auth   string
	// RequestID is the idempotency id of the write it makes, if any.
	RequestID string
	// Region is the region the action targets, if any.
	Region string
	// PolicyVersion is the policy in force where the action is handled.
	PolicyVersion string
	// Args: see AdminDetail. The map is not modified.
	Args map[string]string
}

// Appender is where admin records go: a *Log.
type Appender interface {
	Append(ctx context.Context, e Entry) error
}

// NotRecordedError is the error of an admin action refused because its
// record could not be written (a full disk, a closed log): nothing was
// changed.
type NotRecordedError struct {
	Action string
	Err    error
}

func (e *NotRecordedError) Error() string {
	return fmt.Sprintf("%s refused: its audit record could not be written, so nothing was changed: %v", e.Action, e.Err)
}

func (e *NotRecordedError) Unwrap() error { return e.Err }

// Admin records the privileged actions one controller handles in its audit
// log. The zero Admin (no Log) records nothing and only runs the actions.
type Admin struct {
	// Log is the controller's audit log.
	Log Appender
	// Origin is the controller's region, the origin of every record.
	Origin string
}

// Enabled reports whether actions are recorded.
func (a Admin) Enabled() bool { return a.Log != nil }

// Run records act as applied and then carries it out, failing closed: if
// the record cannot be written, act is not run and the result is a
// *NotRecordedError. When act fails, a record of the same decision id with
// OutcomeFailed and the error follows (best effort: act's error is returned
// either way).
//
// The record comes first, not after the action succeeded, because an
// action in effect without a record is exactly what the audit log exists
// to rule out: recording afterwards would leave a committed policy or
// failover unrecorded whenever the disk filled up in between, and that
// cannot be undone. A recorded action that then fails is visible as such.
func (a Admin) Run(ctx context.Context, act AdminAction, do func(context.Context) error) error {
	if a.Log == nil {
		return do(ctx)
	}
	if act.ID == "" {
		act.ID = newActionID()
	}
	if err := a.record(ctx, act, OutcomeApplied, nil); err != nil {
		var ae *AppendError
		if errors.As(err, &ae) && ae.Op == "wait" {
			// The applied record may still reach the disk after this
			// refusal: follow it with the truth.
			_ = a.record(ctx, act, OutcomeFailed, fmt.Errorf("not carried out: its applied record was not confirmed: %v", err))
		}
		return &NotRecordedError{Action: act.Action, Err: err}
	}
	err := do(ctx)
	if err != nil {
		_ = a.record(ctx, act, OutcomeFailed, err)
	}
	return err
}

// Refuse records act as refused with cause (nothing changed) and returns
// cause; when the record cannot be written either, the error says so too
// (the action stays refused).
func (a Admin) Refuse(ctx context.Context, act AdminAction, cause error) error {
	if a.Log == nil {
		return cause
	}
	if act.ID == "" {
		act.ID = newActionID()
	}
	if err := a.record(ctx, act, OutcomeRefused, cause); err != nil {
		return fmt.Errorf("%w (the refusal could not be recorded in the audit log: %v)", cause, err)
	}
	return cause
}

// record appends one record of act.
func (a Admin) record(ctx context.Context, act AdminAction, outcome string, cause error) error {
	e, err := act.entry(a.Origin, outcome, cause)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), AdminRecordTimeout)
	defer cancel()
	return a.Log.Append(ctx, e)
}

// entry builds the Entry of one record of act.
func (act AdminAction) entry(origin, outcome string, cause error) (Entry, error) {
	d := AdminDetail{Action: act.Action, Actor: act.Actor, Auth: act.Auth, Outcome: outcome, Args: act.Args}
	if cause != nil {
		d.Error = truncateUTF8(cause.Error(), maxAdminError)
	}
	if err := d.validate(); err != nil {
		return Entry{}, &EntryError{Field: "cost", Reason: err.Error()}
	}
	b, err := json.Marshal(d)
	if err != nil {
		return Entry{}, &EntryError{Field: "cost", Reason: err.Error()}
	}
	return Entry{Kind: KindAdminAction, DecisionID: act.ID, RequestID: act.RequestID, Origin: origin,
		Region: act.Region, PolicyVersion: act.PolicyVersion, Cost: b}, nil
}

func newActionID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "adm-" + hex.EncodeToString(b[:])
}

// truncateUTF8 cuts s to at most n bytes on a rune boundary, marking the cut.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// appendAdminText renders the detail of an admin record for AppendText.
func appendAdminText(b []byte, d AdminDetail) []byte {
	for _, kv := range [][2]string{{"action", d.Action}, {"actor", d.Actor}, {"auth", d.Auth}, {"outcome", d.Outcome}} {
		b = fmt.Appendf(b, " %s=%s", kv[0], quoteIfNeeded(kv[1]))
	}
	keys := make([]string, 0, len(d.Args))
	for k := range d.Args {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b = fmt.Appendf(b, " %s=%s", k, quoteIfNeeded(d.Args[k]))
	}
	if d.Error != "" {
		b = fmt.Appendf(b, " error=%q", d.Error)
	}
	return b
}
