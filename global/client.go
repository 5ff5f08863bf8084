package global

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// APIError is an error answer of the admin API.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("admin API answered %d %s", e.Status, e.Code)
	}
	return e.Message
}

// Is matches the sentinel of the code, so errors.Is(err, ErrNoLeader) works
// on client errors.
func (e *APIError) Is(target error) bool {
	s, ok := codeSentinels[e.Code]
	return ok && s == target
}

func apiErrorFrom(status int, body []byte) *APIError {
	var eb ErrorBody
	if err := json.Unmarshal(body, &eb); err == nil && eb.Error.Code != "" {
		return &APIError{Status: status, Code: eb.Error.Code, Message: eb.Error.Message}
	}
	msg := strings.TrimSpace(string(body))
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	return &APIError{Status: status, Code: CodeInternal, Message: fmt.Sprintf("admin API answered %d: %s", status, msg)}
}

// Client calls a controller's global admin API (any controller: writes are
// forwarded to the leader). Writes carry a request id and are retried with
// it, so a retried write is applied at most once.
type Client struct {
	// BaseURL of the controller's admin API ("http://127.0.0.1:8081").
	BaseURL string
	// Token is the admin bearer token.
	Token string
	// HTTP is the HTTP client (default: http.DefaultClient).
	HTTP *http.Client
	// Retries is how many times a request is retried after a connection
	// error or a no-leader answer (default 3).
	Retries int
	// Backoff before the first retry, doubled each time (default 200ms).
	Backoff time.Duration
}

// NewClient returns a client of the admin API at baseURL.
func NewClient(baseURL, token string, hc *http.Client) *Client {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token, HTTP: hc, Retries: 3, Backoff: 200 * time.Millisecond}
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = b
	}
	backoff := c.Backoff
	var err error
	for attempt := 0; ; attempt++ {
		err = c.once(ctx, method, path, body, out)
		if err == nil || attempt >= c.Retries || !clientRetryable(err) || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff *= 2
	}
	return err
}

func clientRetryable(err error) bool {
	var api *APIError
	if errors.As(err, &api) {
		switch api.Code {
		case CodeNoLeader:
			// The node has already waited its hold timeout for a leader:
			// asking again only multiplies the wait.
			return false
		case CodeNotLeader, CodeClosed:
			return true
		}
		return api.Status == http.StatusBadGateway
	}
	var uerr *url.Error
	return errors.As(err, &uerr) && !uerr.Timeout() && !errors.Is(err, context.Canceled)
}

func (c *Client) once(ctx context.Context, method, path string, body []byte, out any) error {
	var rd *bytes.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	var req *http.Request
	var err error
	if rd != nil {
		req, err = http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	} else {
		req, err = http.NewRequestWithContext(ctx, method, c.BaseURL+path, nil)
	}
	if err != nil {
		return fmt.Errorf("admin request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer drainBody(resp.Body)
	return decodeResponse(resp, out)
}

func withID(id string) string {
	if id == "" {
		return NewRequestID()
	}
	return id
}

// Health returns the node's health.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	err := c.do(ctx, http.MethodGet, "/v1/global/health", nil, &h)
	return h, err
}

// Status returns the node's status: health, Raft servers, members, active
// policy.
func (c *Client) Status(ctx context.Context) (NodeStatus, error) {
	var s NodeStatus
	err := c.do(ctx, http.MethodGet, "/v1/global/status", nil, &s)
	return s, err
}

// Join asks the cluster to add a member.
func (c *Client) Join(ctx context.Context, req JoinRequest) error {
	req.RequestID = withID(req.RequestID)
	return c.do(ctx, http.MethodPost, "/v1/global/join", req, nil)
}

// Leave removes a member.
func (c *Client) Leave(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/global/members/"+url.PathEscape(id), nil, nil)
}

// ApplyPolicy applies a policy document; one identical to the active
// policy adds no version (PolicyApplied.Unchanged).
func (c *Client) ApplyPolicy(ctx context.Context, req PolicyRequest) (PolicyApplied, error) {
	req.RequestID = withID(req.RequestID)
	var pv PolicyApplied
	err := c.do(ctx, http.MethodPost, "/v1/global/policy", req, &pv)
	return pv, err
}

// ReadOptions select the read mode.
type ReadOptions struct {
	// Consistent asks for a linearizable read on the leader (one Raft round
	// trip) instead of the answering node's local state.
	Consistent bool
}

func (o ReadOptions) query(q url.Values) string {
	if o.Consistent {
		q.Set("consistent", "1")
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

// Policy returns the active policy with its document.
func (c *Client) Policy(ctx context.Context, o ReadOptions) (PolicyVersion, error) {
	var pv PolicyVersion
	err := c.do(ctx, http.MethodGet, "/v1/global/policy"+o.query(url.Values{}), nil, &pv)
	return pv, err
}

// PolicyVersion returns a kept policy version.
func (c *Client) PolicyVersion(ctx context.Context, v uint64, o ReadOptions) (PolicyVersion, error) {
	var pv PolicyVersion
	err := c.do(ctx, http.MethodGet, "/v1/global/policy"+o.query(url.Values{"version": {fmt.Sprint(v)}}), nil, &pv)
	return pv, err
}

// PolicyHistory returns the kept versions, oldest first, without documents.
func (c *Client) PolicyHistory(ctx context.Context, o ReadOptions) (PolicyHistory, error) {
	var h PolicyHistory
	err := c.do(ctx, http.MethodGet, "/v1/global/policy"+o.query(url.Values{"history": {"1"}}), nil, &h)
	return h, err
}

// Regions returns the recorded region statuses.
func (c *Client) Regions(ctx context.Context, o ReadOptions) (RegionList, error) {
	var l RegionList
	err := c.do(ctx, http.MethodGet, "/v1/global/regions"+o.query(url.Values{}), nil, &l)
	return l, err
}

// Region returns one region's status.
func (c *Client) Region(ctx context.Context, region string, o ReadOptions) (RegionRead, error) {
	var r RegionRead
	err := c.do(ctx, http.MethodGet, "/v1/global/regions/"+url.PathEscape(region)+o.query(url.Values{}), nil, &r)
	return r, err
}

// SetRegionState sets a region's state.
func (c *Client) SetRegionState(ctx context.Context, region string, req RegionRequest) (Result, error) {
	req.RequestID = withID(req.RequestID)
	var res Result
	err := c.do(ctx, http.MethodPut, "/v1/global/regions/"+url.PathEscape(region), req, &res)
	return res, err
}

// SetTargets sets a region's failover targets.
func (c *Client) SetTargets(ctx context.Context, region string, req TargetsRequest) (Result, error) {
	req.RequestID = withID(req.RequestID)
	var res Result
	err := c.do(ctx, http.MethodPut, "/v1/global/regions/"+url.PathEscape(region)+"/targets", req, &res)
	return res, err
}

// Trigger fails a region over (or drains it with req.Drain).
func (c *Client) Trigger(ctx context.Context, req FailoverRequest) (Result, error) {
	req.RequestID = withID(req.RequestID)
	var res Result
	err := c.do(ctx, http.MethodPost, "/v1/global/failover/trigger", req, &res)
	return res, err
}

// Recover makes a region active again.
func (c *Client) Recover(ctx context.Context, req FailoverRequest) (Result, error) {
	req.RequestID = withID(req.RequestID)
	var res Result
	err := c.do(ctx, http.MethodPost, "/v1/global/failover/recover", req, &res)
	return res, err
}

// FailoverStatus returns the failover picture of every known region.
func (c *Client) FailoverStatus(ctx context.Context, o ReadOptions) (FailoverStatus, error) {
	var s FailoverStatus
	err := c.do(ctx, http.MethodGet, "/v1/global/failover"+o.query(url.Values{}), nil, &s)
	return s, err
}

// AppendCheckpoint anchors an audit checkpoint.
func (c *Client) AppendCheckpoint(ctx context.Context, req CheckpointRequest) (Result, error) {
	req.RequestID = withID(req.RequestID)
	var res Result
	err := c.do(ctx, http.MethodPost, "/v1/global/checkpoints", req, &res)
	return res, err
}

// Checkpoints returns the kept checkpoints (of one controller if controller
// is not empty).
func (c *Client) Checkpoints(ctx context.Context, controller string, o ReadOptions) (CheckpointList, error) {
	q := url.Values{}
	if controller != "" {
		q.Set("controller", controller)
	}
	var l CheckpointList
	err := c.do(ctx, http.MethodGet, "/v1/global/checkpoints"+o.query(q), nil, &l)
	return l, err
}
