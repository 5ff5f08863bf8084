package global_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/globaltest"
)

// testValidator accepts documents that start with "version:" and returns
// the rest of the first line as the declared version.
func testValidator(name string, doc []byte) (string, error) {
	first, _, _ := strings.Cut(string(doc), "\n")
	v, ok := strings.CutPrefix(first, "version:")
	if !ok {
		return "", fmt.Errorf("%s:1:1: the document must start with \"version:\"", name)
	}
	return strings.TrimSpace(v), nil
}

func apiCluster(t *testing.T) *globaltest.Cluster {
	return globaltest.NewCluster(t, 1, globaltest.Options{Configure: func(i int, cfg *global.Config) {
		cfg.PolicyValidator = testValidator
		cfg.PolicyCompiler = func(doc []byte) (any, error) { return len(doc), nil }
	}})
}

type rawResp struct {
	status int
	header http.Header
	body   global.ErrorBody
	raw    string
}

func call(t *testing.T, method, url, token, body string) rawResp {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := rawResp{status: resp.StatusCode, header: resp.Header, raw: string(b)}
	_ = json.Unmarshal(b, &r.body)
	return r
}

func TestAdminAPIAuth(t *testing.T) {
	c := apiCluster(t)
	url := c.Nodes[0].URL() + "/v1/global/status"
	for name, tok := range map[string]string{"no token": "", "wrong token": "nope", "prefix of the token": "test"} {
		r := call(t, "GET", url, tok, "")
		if r.status != 401 || r.body.Error.Code != global.CodeUnauthorized || !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: %d %s", name, r.status, r.raw)
		}
	}
	// Writes are refused too, and nothing is applied.
	r := call(t, "POST", c.Nodes[0].URL()+"/v1/global/failover/trigger", "", `{"region":"region-0"}`)
	if r.status != 401 || !c.Nodes[0].Node.State().Routable("region-0") {
		t.Fatalf("unauthenticated trigger: %d %s", r.status, r.raw)
	}
	cl := global.NewClient(c.Nodes[0].URL(), "wrong", nil)
	if _, err := cl.Status(ctxT(t, 5*time.Second)); !errors.Is(err, global.ErrUnauthorized) {
		t.Fatalf("client with a wrong token: %v", err)
	}
	if r := call(t, "GET", url, c.Token, ""); r.status != 200 {
		t.Fatalf("valid token: %d %s", r.status, r.raw)
	}
}

func TestAdminAPIErrors(t *testing.T) {
	c := apiCluster(t)
	base := c.Nodes[0].URL()
	big := strings.Repeat("x", 700<<10)
	huge := "version: 1\n" + strings.Repeat("x", global.MaxPolicySize)
	hugeJSON, _ := json.Marshal(global.PolicyRequest{Name: "big.yaml", Document: huge})
	cases := []struct {
		name, method, path, body string
		status                   int
		code, msg                string
	}{
		{"bad json", "POST", "/v1/global/policy", `{"name":`, 400, global.CodeInvalid, "decode JSON body"},
		{"body too large", "POST", "/v1/global/policy", `{"document":"` + big + `"}`, 400, global.CodeInvalid, "larger than"},
		{"empty policy", "POST", "/v1/global/policy", `{"name":"p.yaml","document":""}`, 422, global.CodeInvalidPolicy, "p.yaml is empty"},
		{"policy over the limit", "POST", "/v1/global/policy", string(hugeJSON), 422, global.CodeInvalidPolicy, "more than the limit"},
		{"validator rejects", "POST", "/v1/global/policy", `{"name":"p.yaml","document":"zones: {}"}`, 422, global.CodeInvalidPolicy, `p.yaml:1:1: the document must start with "version:"`},
		{"no policy yet", "GET", "/v1/global/policy", "", 404, global.CodeNotFound, "no policy has been applied"},
		{"version not a number", "GET", "/v1/global/policy?version=abc", "", 400, global.CodeInvalid, `version "abc" is not a number`},
		{"unknown version", "GET", "/v1/global/policy?version=9", "", 404, global.CodeNotFound, "policy version 9 is not kept"},
		{"unknown region trigger", "POST", "/v1/global/failover/trigger", `{"region":"mars-1"}`, 404, global.CodeUnknownRegion, `region "mars-1" is not known to the cluster (known: region-0)`},
		{"bad region name", "POST", "/v1/global/failover/trigger", `{"region":"Mars 1"}`, 400, global.CodeInvalid, `region name "Mars 1"`},
		{"bad state", "PUT", "/v1/global/regions/region-0", `{"state":"exploded"}`, 400, global.CodeInvalid, `unknown region state "exploded"`},
		{"cas conflict", "PUT", "/v1/global/regions/region-0", `{"state":"failed","expect":"draining"}`, 409, global.CodeConflict, `region "region-0" is active, expected draining`},
		{"drain on recover", "POST", "/v1/global/failover/recover", `{"region":"region-0","drain":true}`, 400, global.CodeInvalid, "drain is only valid for trigger"},
		{"get unknown region", "GET", "/v1/global/regions/mars-1", "", 404, global.CodeUnknownRegion, `region "mars-1"`},
		{"self target", "PUT", "/v1/global/regions/region-0/targets", `{"targets":["region-0"]}`, 400, global.CodeInvalid, "its own failover target"},
		{"checkpoint without head", "POST", "/v1/global/checkpoints", `{"checkpoint":{"controller_id":"c","segment":"1","sequence":1,"time":"2026-12-01T00:00:00Z"}}`, 400, global.CodeInvalid, "head hash"},
		{"no checkpoints", "GET", "/v1/global/checkpoints?controller=nobody", "", 404, global.CodeNotFound, `no checkpoints of controller "nobody"`},
		{"join without address", "POST", "/v1/global/join", `{"member":{"id":"x","region":"region-0","raft_addr":"127.0.0.1:1"}}`, 400, global.CodeInvalid, "admin address"},
		{"unknown endpoint", "GET", "/v1/global/nothing", "", 404, global.CodeNotFound, "no admin endpoint GET /v1/global/nothing"},
		{"wrong method", "DELETE", "/v1/global/policy", "", 404, global.CodeNotFound, "no admin endpoint DELETE /v1/global/policy"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := c.Nodes[0].Node.State()
			r := call(t, tc.method, base+tc.path, c.Token, tc.body)
			if r.status != tc.status || r.body.Error.Code != tc.code || !strings.Contains(r.body.Error.Message, tc.msg) {
				t.Fatalf("got %d %s, want %d %s containing %q", r.status, r.raw, tc.status, tc.code, tc.msg)
			}
			if c.Nodes[0].Node.State() != before {
				t.Fatal("a refused request changed the state")
			}
		})
	}
}

func TestAdminAPIWorkflow(t *testing.T) {
	c := apiCluster(t)
	cl := c.Nodes[0].Client
	ctx := ctxT(t, 10*time.Second)
	pv, err := cl.ApplyPolicy(ctx, global.PolicyRequest{Name: "p.yaml", Document: "version: 2026-12\nzones: {}", Actor: "operator:alice", Reason: "initial"})
	if err != nil || pv.Version != 1 || pv.Declared != "2026-12" || pv.Actor != "operator:alice" {
		t.Fatalf("apply: %+v %v", pv, err)
	}
	if v, err := c.Nodes[0].Node.State().CompiledPolicy(); v != len("version: 2026-12\nzones: {}") || err != nil {
		t.Fatalf("compiled: %v %v", v, err)
	}
	got, err := cl.Policy(ctx, global.ReadOptions{Consistent: true})
	if err != nil || string(got.Document) != "version: 2026-12\nzones: {}" || got.Ref() != pv.Ref() {
		t.Fatalf("show: %+v %v", got, err)
	}
	// Idempotent retry: the same request id gives the first result.
	req := global.PolicyRequest{Name: "p.yaml", Document: "version: 2\n", RequestID: "retry-1"}
	a, err1 := cl.ApplyPolicy(ctx, req)
	b, err2 := cl.ApplyPolicy(ctx, req)
	if err1 != nil || err2 != nil || a.Version != 2 || b.Version != 2 || a.Index != b.Index {
		t.Fatalf("retry: %+v %+v %v %v", a, b, err1, err2)
	}
	h, err := cl.PolicyHistory(ctx, global.ReadOptions{})
	if err != nil || len(h.Versions) != 2 || h.Versions[0].Document != nil {
		t.Fatalf("history: %+v %v", h, err)
	}
	// Failover trigger, status, recover.
	res, err := cl.Trigger(ctx, global.FailoverRequest{Region: "region-0", Reason: "drill", Actor: "operator:bob"})
	if err != nil || !res.Changed || res.Region.State != global.RegionFailed {
		t.Fatalf("trigger: %+v %v", res, err)
	}
	res, err = cl.Trigger(ctx, global.FailoverRequest{Region: "region-0", Reason: "again"})
	if err != nil || res.Changed || res.Region.Reason != "drill" {
		t.Fatalf("trigger twice: %+v %v", res, err)
	}
	fs, err := cl.FailoverStatus(ctx, global.ReadOptions{})
	if err != nil || len(fs.Regions) != 1 || fs.Regions[0].Routable || fs.Regions[0].Actor != "operator:bob" || fs.Regions[0].Controllers[0] != "node-0" {
		t.Fatalf("status: %+v %v", fs, err)
	}
	if _, err := cl.Recover(ctx, global.FailoverRequest{Region: "region-0"}); err != nil || !c.Nodes[0].Node.State().Routable("region-0") {
		t.Fatalf("recover: %v", err)
	}
	if _, err := cl.Trigger(ctx, global.FailoverRequest{Region: "region-0", Drain: true}); err != nil || c.Nodes[0].Node.State().RegionState("region-0") != global.RegionDraining {
		t.Fatalf("drain: %v", err)
	}
	if _, err := cl.SetTargets(ctx, "region-0", global.TargetsRequest{Targets: []string{"region-9"}}); err != nil {
		t.Fatal(err)
	}
	if r, err := cl.Region(ctx, "region-9", global.ReadOptions{}); err != nil || !r.Routable {
		t.Fatalf("a target makes a region known: %+v %v", r, err)
	}
	// Checkpoints.
	cp := global.Checkpoint{ControllerID: "node-0", Segment: "000001", Sequence: 1, HeadHash: "ab", Count: 10, Time: time.Now().UTC()}
	if _, err := cl.AppendCheckpoint(ctx, global.CheckpointRequest{Checkpoint: cp}); err != nil {
		t.Fatal(err)
	}
	cp.Sequence = 0
	if _, err := cl.AppendCheckpoint(ctx, global.CheckpointRequest{Checkpoint: cp}); !errors.Is(err, global.ErrConflict) {
		t.Fatalf("regression: %v", err)
	}
	l, err := cl.Checkpoints(ctx, "node-0", global.ReadOptions{Consistent: true})
	if err != nil || len(l.Checkpoints["node-0"]) != 1 {
		t.Fatalf("checkpoints: %+v %v", l, err)
	}
	st, err := cl.Status(ctx)
	if err != nil || len(st.Servers) != 1 || st.Servers[0].Suffrage != "voter" || st.Policy.Version != 2 || st.Policy.Document != nil {
		t.Fatalf("node status: %+v %v", st, err)
	}
}

// TestClientErrorMessages: a non-JSON error answer (a proxy in between)
// still gives a readable error.
func TestClientErrorMessages(t *testing.T) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "upstream connect error", http.StatusBadGateway)
	})}
	ln := mustListen(t)
	go srv.Serve(ln)
	defer srv.Close()
	cl := global.NewClient("http://"+ln.Addr().String(), "t", nil)
	cl.Retries, cl.Backoff = 1, time.Millisecond
	_, err := cl.Status(ctxT(t, 5*time.Second))
	var api *global.APIError
	if !errors.As(err, &api) || api.Status != 502 || !strings.Contains(err.Error(), "upstream connect error") {
		t.Fatalf("got %v", err)
	}
	http.DefaultClient.CloseIdleConnections()
}
