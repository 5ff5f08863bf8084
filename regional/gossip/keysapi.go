package gossip

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
)

// Paths of the keyring admin API (KeysHandler).
const (
	KeysPath        = "/v1/gossip/keys"
	KeysInstallPath = KeysPath + "/install"
	KeysUsePath     = KeysPath + "/use"
	KeysRemovePath  = KeysPath + "/remove"
)

// KeysListing is the answer of GET /v1/gossip/keys.
type KeysListing struct {
	// Local are this controller's key fingerprints, primary first.
	Local []string `json:"local"`
	// Keys counts, per fingerprint, the controllers that hold it and that
	// encrypt with it, over those that answered.
	Keys []KeyCount `json:"keys"`
	// Pool is every controller's answer.
	Pool KeyOpResult `json:"pool"`
}

// KeyCount is one key's spread over the pool.
type KeyCount struct {
	Fingerprint string `json:"fingerprint"`
	Installed   int    `json:"installed"`
	Primary     int    `json:"primary"`
}

// KeyRequest is the body of POST /v1/gossip/keys/{install,use,remove}.
type KeyRequest struct {
	// Key is base64 of KeyBytes bytes.
	Key string `json:"key"`
}

// keysErrorBody is the error answer: {"error": {"code", "message"}}, the
// shape of every admin API error.
type keysErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// KeysHandler serves the keyring admin API of n:
//
//	GET  /v1/gossip/keys          every controller's fingerprints (KeysListing)
//	POST /v1/gossip/keys/install  {"key": "<base64>"}  (KeyOpResult)
//	POST /v1/gossip/keys/use      {"key": "<base64>"}
//	POST /v1/gossip/keys/remove   {"key": "<base64>"}
//
// An operation every controller applied answers 200; one some controllers
// refused or did not answer, 502 with the same KeyOpResult body (Failed >
// 0). A bad key is 400 (invalid_key), an operation this controller refuses
// 409 (key_refused; nothing was sent). It does not authenticate: mount it
// behind the admin API's authentication. Answers never contain keys.
//
// KeysHandler does not record what it changes: a controller serves
// GuardedKeysHandler, whose guard records every change in its audit log.
func KeysHandler(n *Node) http.Handler { return GuardedKeysHandler(n, nil) }

// KeyOpGuard stands around every keyring change (install, use, remove)
// that GuardedKeysHandler is asked for, so that the controller can record
// it (in its audit log) before it takes effect, and refuse it if it cannot.
// It is called once the request is read and checked against this
// controller's keyring: fingerprint names the key ("" when the request
// holds no valid key); refused, when not nil, says why the change is
// refused before anything changed, and the guard returns it (possibly
// annotated, wrapping it). Otherwise the guard calls apply, which carries
// the change out on every controller, and returns its outcome; or it
// declines to call it and returns why (the change could not be recorded),
// and nothing changes: the handler answers 503 audit_unavailable with that
// error. r is the request, for the caller's identity.
type KeyOpGuard func(r *http.Request, op KeyOp, fingerprint string, refused error,
	apply func() (KeyOpResult, error)) (KeyOpResult, error)

// errKeyRequest is a request body that is not {"key": "..."}.
var errKeyRequest = errors.New(`want a JSON body {"key": "<base64 of 32 bytes>"}`)

// GuardedKeysHandler is KeysHandler whose changes go through guard (nil:
// none). Listings are not guarded.
func GuardedKeysHandler(n *Node, guard KeyOpGuard) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := strings.TrimSuffix(r.URL.Path, "/")
		var op KeyOp
		switch path {
		case KeysPath:
			op = KeyList
		case KeysInstallPath:
			op = KeyInstall
		case KeysUsePath:
			op = KeyUse
		case KeysRemovePath:
			op = KeyRemove
		default:
			keysError(w, http.StatusNotFound, "not_found", "no such keyring endpoint: "+r.URL.Path)
			return
		}
		want := http.MethodPost
		if op == KeyList {
			want = http.MethodGet
		}
		if r.Method != want {
			w.Header().Set("Allow", want)
			keysError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s %s: use %s", r.Method, path, want))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), n.cfg.KeyOpTimeout)
		defer cancel()
		if op == KeyList {
			res, err := n.PoolKeys(ctx)
			if err != nil && !isPartial(err) {
				keysFailure(w, err)
				return
			}
			writeKeysJSON(w, http.StatusOK, listing(n.ListKeys(), res))
			return
		}
		var req KeyRequest
		var refused error
		fp := ""
		dec := json.NewDecoder(io.LimitReader(r.Body, 4<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			refused = fmt.Errorf("gossip key %s: %w", op, errKeyRequest)
		} else if kb, err := decodeKey(req.Key); err != nil {
			refused = fmt.Errorf("gossip key %s: %w: %v", op, ErrInvalidKey, err)
		} else {
			fp = fingerprint(kb)
			refused = n.checkKeyOp(op, kb)
		}
		applied := false
		apply := func() (KeyOpResult, error) {
			applied = true
			return n.KeyOperation(ctx, op, req.Key)
		}
		var (
			res KeyOpResult
			err error
		)
		switch {
		case guard != nil:
			res, err = guard(r, op, fp, refused, apply)
		case refused != nil:
			err = refused
		default:
			res, err = apply()
		}
		switch {
		case err == nil:
			writeKeysJSON(w, http.StatusOK, res)
		case refused == nil && !applied:
			keysError(w, http.StatusServiceUnavailable, "audit_unavailable", err.Error())
		case isPartial(err):
			writeKeysJSON(w, http.StatusBadGateway, res)
		case errors.Is(err, errKeyRequest):
			keysError(w, http.StatusBadRequest, "invalid_request", err.Error())
		default:
			keysFailure(w, err)
		}
	})
}

func isPartial(err error) bool {
	var pe *KeyOpError
	return errors.As(err, &pe)
}

func keysFailure(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrInvalidKey):
		keysError(w, http.StatusBadRequest, "invalid_key", err.Error())
	case errors.Is(err, ErrKeyRefused):
		keysError(w, http.StatusConflict, "key_refused", err.Error())
	case errors.Is(err, ErrClosed):
		keysError(w, http.StatusServiceUnavailable, "closed", err.Error())
	default:
		keysError(w, http.StatusInternalServerError, "internal", err.Error())
	}
}

// listing counts each key over the controllers that answered.
func listing(local []string, res KeyOpResult) KeysListing {
	counts := map[string]*KeyCount{}
	for _, nr := range res.Nodes {
		if !nr.OK {
			continue
		}
		for i, fp := range nr.Keys {
			c := counts[fp]
			if c == nil {
				c = &KeyCount{Fingerprint: fp}
				counts[fp] = c
			}
			c.Installed++
			if i == 0 {
				c.Primary++
			}
		}
	}
	l := KeysListing{Local: local, Pool: res, Keys: []KeyCount{}}
	for _, c := range counts {
		l.Keys = append(l.Keys, *c)
	}
	slices.SortFunc(l.Keys, func(a, b KeyCount) int {
		if a.Primary != b.Primary {
			return b.Primary - a.Primary
		}
		return strings.Compare(a.Fingerprint, b.Fingerprint)
	})
	return l
}

func writeKeysJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func keysError(w http.ResponseWriter, status int, code, msg string) {
	var b keysErrorBody
	b.Error.Code, b.Error.Message = code, msg
	writeKeysJSON(w, status, b)
}

// KeysClient calls a controller's keyring admin API.
type KeysClient struct {
	// BaseURL of the admin API ("https://10.0.0.5:8081").
	BaseURL string
	// Token is the admin bearer token.
	Token string
	// HTTP is the client (nil: http.DefaultClient).
	HTTP *http.Client
}

// KeysAPIError is an error answer of the keyring API.
type KeysAPIError struct {
	Status  int
	Code    string
	Message string
}

func (e *KeysAPIError) Error() string {
	return fmt.Sprintf("%s (%s, HTTP %d)", e.Message, e.Code, e.Status)
}

// List returns every controller's key fingerprints.
func (c *KeysClient) List(ctx context.Context) (KeysListing, error) {
	var l KeysListing
	_, err := c.do(ctx, http.MethodGet, KeysPath, nil, &l)
	return l, err
}

// Install, Use and Remove run a keyring operation on the pool. With some
// controllers failed the result comes with a *KeyOpError.
func (c *KeysClient) Install(ctx context.Context, key string) (KeyOpResult, error) {
	return c.op(ctx, KeysInstallPath, key)
}

// Use makes key the primary key everywhere.
func (c *KeysClient) Use(ctx context.Context, key string) (KeyOpResult, error) {
	return c.op(ctx, KeysUsePath, key)
}

// Remove drops key everywhere.
func (c *KeysClient) Remove(ctx context.Context, key string) (KeyOpResult, error) {
	return c.op(ctx, KeysRemovePath, key)
}

func (c *KeysClient) op(ctx context.Context, path, key string) (KeyOpResult, error) {
	var res KeyOpResult
	status, err := c.do(ctx, http.MethodPost, path, KeyRequest{Key: key}, &res)
	if err == nil && status == http.StatusBadGateway {
		err = &KeyOpError{Result: res}
	}
	return res, err
}

func (c *KeysClient) do(ctx context.Context, method, path string, in, out any) (int, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.BaseURL, "/")+path, body)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("decode keyring API answer: %w", err)
		}
		return resp.StatusCode, nil
	case http.StatusBadGateway:
		// Some controllers failed: the body is the KeyOpResult (a proxy's
		// own 502 is not).
		if res, ok := out.(*KeyOpResult); ok && json.Unmarshal(b, res) == nil && len(res.Nodes) > 0 {
			return resp.StatusCode, nil
		}
	}
	var eb keysErrorBody
	if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
		return resp.StatusCode, &KeysAPIError{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message}
	}
	msg := strings.TrimSpace(string(b))
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	return resp.StatusCode, &KeysAPIError{Status: resp.StatusCode, Code: "http_" + fmt.Sprint(resp.StatusCode), Message: msg}
}
