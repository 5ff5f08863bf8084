package gossip

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// pool opens n controllers of n regions, all with key, joined to the first.
func pool(t *testing.T, key string, edit func(i int, cfg *Config)) ([]*Node, []string) {
	t.Helper()
	regions := []string{"us-east-1", "us-west-2", "eu-west-1"}
	var nodes []*Node
	for i, r := range regions {
		cfg := testConfig(t, fmt.Sprintf("c%d.%s", i, r), r, key)
		if i > 0 {
			cfg.Join = []string{nodes[0].Addr()}
		}
		if edit != nil {
			edit(i, &cfg)
		}
		nodes = append(nodes, open(t, cfg))
	}
	waitFor(t, 15*time.Second, "every controller to know the others", func() error {
		for _, n := range nodes {
			if got := len(n.livePeers()); got != len(nodes)-1 {
				return fmt.Errorf("%s knows %d live peers", n.cfg.NodeName, got)
			}
		}
		return nil
	})
	return nodes, regions
}

// publishAll publishes generation gen of every region and waits until every
// controller holds every other region's.
func publishAll(t *testing.T, nodes []*Node, regions []string, gen uint64) {
	t.Helper()
	for i, n := range nodes {
		if err := n.Publish(buildSummary(t, regions[i], gen, 3000)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 20*time.Second, fmt.Sprintf("summaries of generation %d everywhere", gen), func() error {
		for _, n := range nodes {
			for _, r := range regions {
				if r == n.cfg.Region {
					continue
				}
				if err := holds(n, r, gen); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

func fp(t testing.TB, key string) string {
	t.Helper()
	f, err := KeyFingerprint(key)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// everyone checks each controller's keyring (fingerprints, primary first).
func everyone(t *testing.T, nodes []*Node, want ...string) {
	t.Helper()
	for _, n := range nodes {
		if got := n.ListKeys(); !slices.Equal(got, want) {
			t.Fatalf("%s holds %v, want %v", n.cfg.NodeName, got, want)
		}
	}
}

// TestKeyRotation: three controllers rotate from k1 to k2 — install on all,
// use, remove the old — each step started on a different controller; the
// pool stays connected and summaries keep flowing, and a controller that
// only knows k1 can no longer join.
func TestKeyRotation(t *testing.T) {
	k1, k2 := newKey(t), newKey(t)
	nodes, regions := pool(t, k1, nil)
	publishAll(t, nodes, regions, 1)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := nodes[0].KeyOperation(ctx, KeyInstall, k2)
	if err != nil {
		t.Fatalf("install: %v", err)
	}
	if res.Failed != 0 || len(res.Nodes) != 3 || res.Nodes[0].Node != nodes[0].cfg.NodeName || res.Fingerprint != fp(t, k2) {
		t.Fatalf("install result %+v", res)
	}
	everyone(t, nodes, fp(t, k1), fp(t, k2))
	if err := nodes[1].UseKey(k2); err != nil {
		t.Fatalf("use: %v", err)
	}
	everyone(t, nodes, fp(t, k2), fp(t, k1))
	if err := nodes[2].RemoveKey(k1); err != nil {
		t.Fatalf("remove: %v", err)
	}
	everyone(t, nodes, fp(t, k2))
	for _, n := range nodes {
		if ks := n.keyring.GetKeys(); len(ks) != 1 || base64.StdEncoding.EncodeToString(ks[0]) != k2 {
			t.Fatalf("%s keyring is not exactly k2", n.cfg.NodeName)
		}
	}

	// Still one pool: new summaries reach everyone, every region is live.
	publishAll(t, nodes, regions, 2)
	for _, n := range nodes {
		for _, r := range regions {
			if v, ok := n.View().Region(r); r != n.cfg.Region && (!ok || !v.Live) {
				t.Fatalf("%s sees %s as not live after the rotation", n.cfg.NodeName, r)
			}
		}
	}
	// A listing across the pool agrees.
	pk, err := nodes[0].PoolKeys(ctx)
	if err != nil || pk.Failed != 0 || len(pk.Nodes) != 3 {
		t.Fatalf("pool listing: %+v %v", pk, err)
	}
	// The old key no longer opens the pool; the new one does.
	stale := open(t, testConfig(t, "stale.ap-southeast-1", "ap-southeast-1", k1))
	jctx, jcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer jcancel()
	if _, err := stale.Join(jctx, []string{nodes[0].Addr()}); err == nil {
		t.Fatal("a controller with only the removed key joined")
	}
	fresh := open(t, testConfig(t, "fresh.ap-southeast-1", "ap-southeast-1", k2))
	if _, err := fresh.Join(jctx, []string{nodes[0].Addr()}); err != nil {
		t.Fatalf("a controller with the new key: %v", err)
	}
	for _, n := range nodes {
		if got := counter(t, n.m.keyOps.WithLabelValues("install", "ok")); got != 1 {
			t.Errorf("%s counted %v installs", n.cfg.NodeName, got)
		}
	}
}

// TestKeyOperationRefusals: bad keys and operations the local keyring
// refuses send nothing; repeated operations change nothing.
func TestKeyOperationRefusals(t *testing.T) {
	k1, k2 := newKey(t), newKey(t)
	nodes, _ := pool(t, k1, nil)
	n := nodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	short := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 16))
	for _, bad := range []string{"", "not base64!", short} {
		if _, err := n.KeyOperation(ctx, KeyInstall, bad); !errors.Is(err, ErrInvalidKey) {
			t.Fatalf("install %q: %v, want ErrInvalidKey", bad, err)
		}
	}
	if _, err := n.KeyOperation(ctx, KeyUse, k2); !errors.Is(err, ErrKeyRefused) {
		t.Fatalf("use of a key not installed: %v", err)
	}
	if _, err := n.KeyOperation(ctx, KeyRemove, k1); !errors.Is(err, ErrKeyRefused) {
		t.Fatalf("remove of the primary key: %v", err)
	}
	if _, err := n.KeyOperation(ctx, "rotate", k2); !errors.Is(err, ErrKeyRefused) {
		t.Fatalf("unknown operation: %v", err)
	}
	everyone(t, nodes, fp(t, k1))
	// Idempotent: installing twice, removing an absent key.
	for range 2 {
		if err := n.InstallKey(k2); err != nil {
			t.Fatal(err)
		}
	}
	everyone(t, nodes, fp(t, k1), fp(t, k2))
	for range 2 {
		if err := n.RemoveKey(k2); err != nil {
			t.Fatal(err)
		}
	}
	everyone(t, nodes, fp(t, k1))
	// A repeated operation id is answered, not applied again.
	m := keyOpMsg{Op: keyOpInstall, ID: 42, From: nodes[1].cfg.NodeName, Key: mustDecodeKey(t, k2)}
	nodes[2].handleKeyOp(m)
	if err := nodes[2].RemoveKey(k2); err != nil {
		t.Fatal(err)
	}
	nodes[2].handleKeyOp(m)
	if got := nodes[2].ListKeys(); !slices.Equal(got, []string{fp(t, k1)}) {
		t.Fatalf("a replayed install was applied again: %v", got)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := n.KeyOperation(ctx, KeyList, ""); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}

func mustDecodeKey(t testing.TB, k string) []byte {
	t.Helper()
	b, err := decodeKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestKeyringFile: the keyring survives a restart through KeyringFile, which
// wins over Keys; a controller that fails to persist reports it.
func TestKeyringFile(t *testing.T) {
	k1, k2 := newKey(t), newKey(t)
	dir := t.TempDir()
	files := make([]string, 3)
	nodes, _ := pool(t, k1, func(i int, cfg *Config) {
		files[i] = filepath.Join(dir, fmt.Sprintf("keyring-%d.json", i))
		cfg.KeyringFile = files[i]
	})
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s written at open: %v %v", f, err, st)
		}
	}
	for _, step := range []func() error{func() error { return nodes[0].InstallKey(k2) }, func() error { return nodes[0].UseKey(k2) }, func() error { return nodes[0].RemoveKey(k1) }} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	var f keyringFile
	b, err := os.ReadFile(files[1])
	if err != nil || json.Unmarshal(b, &f) != nil || !slices.Equal(f.Keys, []string{k2}) {
		t.Fatalf("keyring file after the rotation: %s %v", b, err)
	}
	// Restart controller 1 with the old Keys: the file wins and it rejoins.
	cfg := nodes[1].cfg
	if err := nodes[1].Close(); err != nil {
		t.Fatal(err)
	}
	cfg.BindPort, cfg.Join, cfg.Registerer = 0, []string{nodes[0].Addr()}, nil
	back := open(t, cfg)
	if !slices.Equal(back.ListKeys(), []string{fp(t, k2)}) {
		t.Fatalf("restarted controller holds %v", back.ListKeys())
	}
	waitFor(t, 10*time.Second, "the restarted controller back in the pool", func() error {
		if len(back.livePeers()) != 2 {
			return fmt.Errorf("%d live peers", len(back.livePeers()))
		}
		return nil
	})
	// A controller whose file cannot be written: the operation is applied
	// in memory, and reported as failed there.
	if err := os.Remove(files[2]); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(files[2], 0o700); err != nil { // a directory where the file goes: the rename fails
		t.Fatal(err)
	}
	k3 := newKey(t)
	err = nodes[0].InstallKey(k3)
	var pe *KeyOpError
	if !errors.As(err, &pe) || pe.Result.Failed != 1 {
		t.Fatalf("install with one controller unable to persist: %v", err)
	}
	for _, r := range pe.Result.Nodes {
		if r.OK == (r.Node == nodes[2].cfg.NodeName) || (!r.OK && !strings.Contains(r.Error, "not persisted")) {
			t.Fatalf("results %+v", pe.Result.Nodes)
		}
	}
	if !slices.Contains(nodes[2].ListKeys(), fp(t, k3)) {
		t.Fatal("the controller that could not persist did not apply the key")
	}
	// A keyring file that is not valid stops Open.
	badFile := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(badFile, []byte(`{"keys":["c2hvcnQ="]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := testConfig(t, "bad.eu-west-1", "eu-west-1", k1)
	bad.KeyringFile = badFile
	if n, err := Open(context.Background(), bad); err == nil {
		_ = n.Close()
		t.Fatal("Open accepted a keyring file with a 6-byte key")
	}
}

// TestKeysHandler: the admin API and its client.
func TestKeysHandler(t *testing.T) {
	k1, k2 := newKey(t), newKey(t)
	nodes, _ := pool(t, k1, nil)
	const token = "admin-token-of-at-least-32-bytes"
	h := KeysHandler(nodes[0])
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	c := &KeysClient{BaseURL: srv.URL, Token: token, HTTP: hc}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	l, err := c.List(ctx)
	if err != nil || len(l.Pool.Nodes) != 3 || !slices.Equal(l.Local, []string{fp(t, k1)}) ||
		!slices.Equal(l.Keys, []KeyCount{{Fingerprint: fp(t, k1), Installed: 3, Primary: 3}}) {
		t.Fatalf("list: %+v %v", l, err)
	}
	if res, err := c.Install(ctx, k2); err != nil || res.Failed != 0 || len(res.Nodes) != 3 {
		t.Fatalf("install: %+v %v", res, err)
	}
	l, _ = c.List(ctx)
	if !slices.Equal(l.Keys, []KeyCount{{Fingerprint: fp(t, k1), Installed: 3, Primary: 3}, {Fingerprint: fp(t, k2), Installed: 3}}) {
		t.Fatalf("list after install: %+v", l.Keys)
	}
	if _, err := c.Use(ctx, k2); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Remove(ctx, k1); err != nil {
		t.Fatal(err)
	}
	everyone(t, nodes, fp(t, k2))
	raw, _ := json.Marshal(l)
	if strings.Contains(string(raw), k1) || strings.Contains(string(raw), k2) {
		t.Fatal("a listing contains a key")
	}

	var api *KeysAPIError
	if _, err := c.Install(ctx, "short"); !errors.As(err, &api) || api.Status != 400 || api.Code != "invalid_key" {
		t.Fatalf("bad key: %v", err)
	}
	if _, err := c.Remove(ctx, k2); !errors.As(err, &api) || api.Status != 409 || api.Code != "key_refused" {
		t.Fatalf("remove of the primary: %v", err)
	}
	bad := &KeysClient{BaseURL: srv.URL, Token: "wrong", HTTP: hc}
	if _, err := bad.List(ctx); !errors.As(err, &api) || api.Status != 401 {
		t.Fatalf("wrong token: %v", err)
	}
	for _, tc := range []struct {
		method, path, body string
		status             int
	}{
		{http.MethodPost, KeysPath, "", 405},
		{http.MethodGet, KeysInstallPath, "", 405},
		{http.MethodPost, KeysPath + "/rotate", `{"key":"x"}`, 404},
		{http.MethodPost, KeysInstallPath, `{"key": "x", "extra": 1}`, 400},
		{http.MethodPost, KeysInstallPath, `not json`, 400},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var eb keysErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		resp.Body.Close()
		if resp.StatusCode != tc.status || eb.Error.Code == "" {
			t.Errorf("%s %s: %d %+v, want %d with an error body", tc.method, tc.path, resp.StatusCode, eb, tc.status)
		}
	}
}

// guardCall is what a KeyOpGuard was called with.
type guardCall struct {
	op          KeyOp
	fingerprint string
	refused     error
	applied     bool
	err         error
}

// TestGuardedKeysHandler: every change goes through the guard, once, after
// it is checked against this controller's keyring and before it takes
// effect: a bad key, a use of a key not installed and a removal of the
// primary key reach it as refused (and change nothing); a guard that
// declines (its record could not be written) leaves every keyring as it
// was and the answer is 503 audit_unavailable; listings are not guarded.
func TestGuardedKeysHandler(t *testing.T) {
	k1, k2 := newKey(t), newKey(t)
	nodes, _ := pool(t, k1, nil)
	var (
		mu      sync.Mutex
		calls   []guardCall
		decline error
	)
	guard := func(r *http.Request, op KeyOp, fingerprint string, refused error, apply func() (KeyOpResult, error)) (KeyOpResult, error) {
		mu.Lock()
		no := decline
		mu.Unlock()
		c := guardCall{op: op, fingerprint: fingerprint, refused: refused}
		var res KeyOpResult
		switch {
		case refused != nil:
			c.err = refused
		case no != nil:
			c.err = no
		default:
			// The change has not happened yet when the guard runs.
			if slices.Contains(nodes[0].ListKeys(), fp(t, k2)) && op == KeyInstall {
				t.Error("the key was installed before the guard let it")
			}
			c.applied = true
			res, c.err = apply()
		}
		mu.Lock()
		calls = append(calls, c)
		mu.Unlock()
		return res, c.err
	}
	srv := httptest.NewServer(GuardedKeysHandler(nodes[0], guard))
	defer srv.Close()
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	c := &KeysClient{BaseURL: srv.URL, Token: "t", HTTP: hc}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	last := func() guardCall {
		mu.Lock()
		defer mu.Unlock()
		if len(calls) == 0 {
			t.Fatal("the guard was not called")
		}
		return calls[len(calls)-1]
	}
	var api *KeysAPIError

	// Declined: nothing changes anywhere.
	mu.Lock()
	decline = errors.New("gossip_key_install refused: its audit record could not be written")
	mu.Unlock()
	if _, err := c.Install(ctx, k2); !errors.As(err, &api) || api.Status != 503 || api.Code != "audit_unavailable" || !strings.Contains(api.Message, "audit record could not be written") {
		t.Fatalf("declined install: %v", err)
	}
	for _, n := range nodes {
		if !slices.Equal(n.ListKeys(), []string{fp(t, k1)}) {
			t.Fatalf("%s has keys %v after a declined install", n.cfg.NodeName, n.ListKeys())
		}
	}
	if g := last(); g.op != KeyInstall || g.fingerprint != fp(t, k2) || g.refused != nil || g.applied {
		t.Fatalf("declined install: guard call %+v", g)
	}
	mu.Lock()
	decline = nil
	mu.Unlock()

	if _, err := c.Install(ctx, k2); err != nil {
		t.Fatal(err)
	}
	if g := last(); g.op != KeyInstall || g.fingerprint != fp(t, k2) || !g.applied || g.err != nil {
		t.Fatalf("install: guard call %+v", g)
	}
	everyone(t, nodes, fp(t, k1), fp(t, k2))

	k3 := newKey(t)
	for _, tc := range []struct {
		name   string
		do     func() error
		op     KeyOp
		fp     string
		status int
		is     error
	}{
		{"bad key", func() error { _, err := c.Install(ctx, "short"); return err }, KeyInstall, "", 400, ErrInvalidKey},
		{"use of a key not installed", func() error { _, err := c.Use(ctx, k3); return err }, KeyUse, fp(t, k3), 409, ErrKeyRefused},
		{"removal of the primary", func() error { _, err := c.Remove(ctx, k1); return err }, KeyRemove, fp(t, k1), 409, ErrKeyRefused},
	} {
		if err := tc.do(); !errors.As(err, &api) || api.Status != tc.status {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if g := last(); g.op != tc.op || g.fingerprint != tc.fp || !errors.Is(g.refused, tc.is) || g.applied {
			t.Fatalf("%s: guard call %+v", tc.name, g)
		}
	}
	everyone(t, nodes, fp(t, k1), fp(t, k2))

	req, _ := http.NewRequest(http.MethodPost, srv.URL+KeysRemovePath, strings.NewReader("not json"))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if g := last(); resp.StatusCode != 400 || g.op != KeyRemove || !errors.Is(g.refused, errKeyRequest) {
		t.Fatalf("bad body: %d, guard call %+v", resp.StatusCode, g)
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(calls)
	}
	before := count()
	if _, err := c.List(ctx); err != nil || before != 6 || count() != 6 {
		t.Fatalf("list: %v; %d guard calls before, %d after, want 6", err, before, count())
	}
}

// TestRemoveKeyLeavesReadersAlone: removing a key from the middle of the
// keyring never writes into a slice a reader (the transport decrypting a
// packet) may hold — the race detector watches — and keeps the order.
func TestRemoveKeyLeavesReadersAlone(t *testing.T) {
	keys := make([][]byte, 5)
	for i := range keys {
		keys[i] = bytes.Repeat([]byte{byte(i + 1)}, KeyBytes)
	}
	kr, err := memberlist.NewKeyring(keys, keys[0])
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				sum := 0
				for _, k := range kr.GetKeys() {
					sum += int(k[0])
				}
				_ = sum
			}
		}()
	}
	for _, i := range []int{2, 1} {
		if err := removeKey(kr, keys[i]); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	got := kr.GetKeys()
	if len(got) != 3 || !bytes.Equal(got[0], keys[0]) || !bytes.Equal(got[1], keys[3]) || !bytes.Equal(got[2], keys[4]) {
		t.Fatalf("keyring after removing keys 2 and 1: %v", got)
	}
	if err := removeKey(kr, keys[0]); err == nil {
		t.Fatal("removed the primary key")
	}
}

func TestKeyWire(t *testing.T) {
	op := keyOpMsg{Op: keyOpUse, ID: 7, From: "c1", Key: bytes.Repeat([]byte{9}, KeyBytes)}
	got, err := decodeKeyOp(op.encode())
	if err != nil || got.Op != op.Op || got.ID != 7 || got.From != "c1" || !bytes.Equal(got.Key, op.Key) {
		t.Fatalf("key op round trip: %+v %v", got, err)
	}
	ack := keyAckMsg{ID: 7, From: "c2", Err: "nope", Keys: []string{"aa", "bb"}}
	gotAck, err := decodeKeyAck(ack.encode())
	if err != nil || gotAck.ID != 7 || gotAck.From != "c2" || gotAck.Err != "nope" || !slices.Equal(gotAck.Keys, ack.Keys) {
		t.Fatalf("key ack round trip: %+v %v", gotAck, err)
	}
	for name, b := range map[string][]byte{
		"truncated":      op.encode()[:10],
		"short key":      keyOpMsg{Op: keyOpInstall, ID: 1, From: "c", Key: []byte{1, 2}}.encode(),
		"list with key":  keyOpMsg{Op: keyOpList, ID: 1, From: "c", Key: op.Key}.encode(),
		"unknown op":     keyOpMsg{Op: 9, ID: 1, From: "c", Key: op.Key}.encode(),
		"trailing bytes": append(op.encode(), 0),
	} {
		if _, err := decodeKeyOp(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, err := decodeKeyAck(append(ack.encode(), 1)); err == nil {
		t.Error("ack with trailing bytes decoded")
	}
}
