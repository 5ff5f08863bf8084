package global

import (
	"errors"
	"fmt"

	"github.com/meridian-llm/meridian/global/audit"
)

// Sentinel errors. Callers branch on them with errors.Is; errors returned by
// the Client match them too.
var (
	// ErrNoLeader: no leader could be reached within the hold timeout. The
	// outcome of a write that returns it is unknown; retry it with the same
	// request id.
	ErrNoLeader = errors.New("no raft leader reachable")
	// ErrNotLeader: this node is not the leader and the request was already
	// forwarded once (one hop at most).
	ErrNotLeader = errors.New("not the raft leader")
	// ErrClosed: the node is closed.
	ErrClosed = errors.New("global node closed")
	// ErrUnauthorized: missing or wrong admin bearer token.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrNotFound: the named object does not exist.
	ErrNotFound = errors.New("not found")
	// ErrInvalid: the request is malformed or names bad values.
	ErrInvalid = errors.New("invalid request")
	// ErrConflict: a compare-and-set precondition did not hold.
	ErrConflict = errors.New("conflict")
	// ErrUnknownRegion: the region is not known to the cluster.
	ErrUnknownRegion = errors.New("unknown region")
	// ErrInvalidPolicy: the policy validator rejected the document.
	ErrInvalidPolicy = errors.New("invalid policy")
	// ErrStrandsTraffic: the change would leave some traffic with no region
	// its residency policy allows; force it to do it anyway.
	ErrStrandsTraffic = errors.New("strands traffic")
	// ErrForbidden: the caller is authenticated but may not do this (a
	// forwarded request without a member controller's certificate).
	ErrForbidden = errors.New("forbidden")
	// ErrAuditUnavailable: a privileged action was refused because its
	// audit record could not be written (the audit log is full or
	// closed); nothing was changed.
	ErrAuditUnavailable = errors.New("audit log unavailable")
)

// Error codes carried in JSON error bodies and RejectedError.
const (
	CodeInvalid       = "invalid_request"
	CodeInvalidPolicy = "invalid_policy"
	CodeUnknownRegion = "unknown_region"
	CodeConflict      = "conflict"
	// CodeStrandsTraffic: the change would leave some traffic with no
	// region its residency policy allows (repeat it with force).
	CodeStrandsTraffic = "strands_traffic"
	CodeNotFound       = "not_found"
	CodeNoLeader       = "no_leader"
	CodeNotLeader      = "not_leader"
	CodeUnauthorized   = "unauthorized"
	CodeClosed         = "closed"
	CodeTimeout        = "timeout"
	CodeInternal       = "internal"
	CodeForbidden      = "forbidden"
	// CodeAuditUnavailable: the action was refused because its audit
	// record could not be written; nothing was changed.
	CodeAuditUnavailable = "audit_unavailable"
)

var codeSentinels = map[string]error{
	CodeInvalid:          ErrInvalid,
	CodeInvalidPolicy:    ErrInvalidPolicy,
	CodeUnknownRegion:    ErrUnknownRegion,
	CodeConflict:         ErrConflict,
	CodeStrandsTraffic:   ErrStrandsTraffic,
	CodeNotFound:         ErrNotFound,
	CodeNoLeader:         ErrNoLeader,
	CodeNotLeader:        ErrNotLeader,
	CodeUnauthorized:     ErrUnauthorized,
	CodeClosed:           ErrClosed,
	CodeForbidden:        ErrForbidden,
	CodeAuditUnavailable: ErrAuditUnavailable,
}

// RejectedError is a deterministic rejection of a command by the state
// machine (or by validation before it is proposed). It is remembered with the
// request id, so a retry gets the same rejection.
type RejectedError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *RejectedError) Error() string { return e.Message }

// Is matches the sentinel of the code (ErrConflict for "conflict", ...).
func (e *RejectedError) Is(target error) bool {
	s, ok := codeSentinels[e.Code]
	return ok && s == target
}

func rejectf(code, format string, args ...any) *RejectedError {
	return &RejectedError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// codeOf maps an error to its JSON error code and HTTP status.
func codeOf(err error) (string, int) {
	var rej *RejectedError
	var api *APIError
	var unrecorded *audit.NotRecordedError
	switch {
	case errors.As(err, &unrecorded):
		return CodeAuditUnavailable, 503
	case errors.As(err, &rej):
		return rej.Code, statusOfCode(rej.Code)
	case errors.As(err, &api):
		return api.Code, api.Status
	case errors.Is(err, ErrInvalidPolicy):
		return CodeInvalidPolicy, 422
	case errors.Is(err, ErrInvalid):
		return CodeInvalid, 400
	case errors.Is(err, ErrNoLeader):
		return CodeNoLeader, 503
	case errors.Is(err, ErrNotLeader):
		return CodeNotLeader, 503
	case errors.Is(err, ErrClosed):
		return CodeClosed, 503
	case errors.Is(err, ErrNotFound):
		return CodeNotFound, 404
	case errors.Is(err, ErrUnknownRegion):
		return CodeUnknownRegion, 404
	case errors.Is(err, ErrConflict):
		return CodeConflict, 409
	case errors.Is(err, ErrUnauthorized):
		return CodeUnauthorized, 401
	}
	return CodeInternal, 500
}

func statusOfCode(code string) int {
	switch code {
	case CodeInvalid:
		return 400
	case CodeInvalidPolicy:
		return 422
	case CodeUnknownRegion, CodeNotFound:
		return 404
	case CodeConflict, CodeStrandsTraffic:
		return 409
	case CodeNoLeader, CodeNotLeader, CodeClosed:
		return 503
	case CodeUnauthorized:
		return 401
	case CodeForbidden:
		return 403
	case CodeAuditUnavailable:
		return 503
	case CodeTimeout:
		return 504
	}
	return 500
}
