package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/regional/gossip"
)

// gossipPool opens three controllers' gossip nodes on loopback, fast.
func gossipPool(t *testing.T, key string) []*gossip.Node {
	t.Helper()
	var nodes []*gossip.Node
	for i, region := range []string{"us-east-1", "us-west-2", "eu-west-1"} {
		cfg := gossip.DefaultConfig()
		cfg.NodeName, cfg.Region = fmt.Sprintf("ctl-%s", region), region
		cfg.BindAddr, cfg.BindPort = "127.0.0.1", 0
		cfg.Keys = []string{key}
		cfg.ProbeInterval, cfg.ProbeTimeout = 200*time.Millisecond, 150*time.Millisecond
		cfg.GossipInterval, cfg.SyncInterval = 20*time.Millisecond, 25*time.Millisecond
		cfg.TCPTimeout, cfg.SuspicionMult = 2*time.Second, 6
		cfg.UpdateTimeout, cfg.LeaveTimeout = 200*time.Millisecond, 200*time.Millisecond
		cfg.DeadNodeReclaimTime, cfg.RetryJoinInterval = 50*time.Millisecond, 200*time.Millisecond
		cfg.Logger = slog.New(slog.DiscardHandler)
		if i > 0 {
			cfg.Join = []string{nodes[0].Addr()}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n, err := gossip.Open(ctx, cfg)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		nodes = append(nodes, n)
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, n := range nodes {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			res, err := n.PoolKeys(ctx)
			cancel()
			if err == nil && len(res.Nodes) == len(nodes) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the pool did not form: %+v %v", res, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nodes
}

func newGossipKey(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

func TestGossipKeysCLI(t *testing.T) {
	k1, k2 := newGossipKey(t), newGossipKey(t)
	nodes := gossipPool(t, k1)
	const token = "admin-token-of-at-least-32-bytes"
	h := gossip.KeysHandler(nodes[1])
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, `{"error":{"code":"unauthorized","message":"missing or invalid bearer token"}}`, http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	admin := []string{"--admin", srv.URL, "--token", token}
	fp1, _ := gossip.KeyFingerprint(k1)
	fp2, _ := gossip.KeyFingerprint(k2)
	keyFile := filepath.Join(t.TempDir(), "new.key")
	if err := os.WriteFile(keyFile, []byte(k2+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	out, code, err := runCLI(t, newApp(), append([]string{"gossip", "keys", "list"}, admin...)...)
	if code != 0 || !regexpLine(out, fp1, "3/3", "3/3") || !regexpLine(out, "ctl-us-west-2", "ok", fp1+"*") {
		t.Fatalf("list: %d %v\n%s", code, err, out)
	}
	out, code, err = runCLI(t, newApp(), append([]string{"gossip", "keys", "install", "--key-file", keyFile}, admin...)...)
	if code != 0 || !strings.Contains(out, "install "+fp2+": 3 of 3 controllers ok") || strings.Contains(out, k2) {
		t.Fatalf("install: %d %v\n%s", code, err, out)
	}
	out, code, _ = runCLI(t, newApp(), append([]string{"gossip", "keys", "list"}, admin...)...)
	if code != 0 || !regexpLine(out, fp2, "3/3", "0/3") {
		t.Fatalf("list after install:\n%s", out)
	}
	if out, code, err = runCLI(t, newApp(), append([]string{"gossip", "keys", "use", "--key", k2}, admin...)...); code != 0 {
		t.Fatalf("use: %d %v\n%s", code, err, out)
	}
	out, code, _ = runCLI(t, newApp(), append([]string{"gossip", "keys", "remove", "--key", k1, "--json"}, admin...)...)
	var res gossip.KeyOpResult
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Op != gossip.KeyRemove || res.Failed != 0 || len(res.Nodes) != 3 {
		t.Fatalf("remove --json: %d\n%s", code, out)
	}
	for _, n := range nodes {
		if got := n.ListKeys(); len(got) != 1 || got[0] != fp2 {
			t.Fatalf("%v after the rotation", got)
		}
	}

	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"gossip", "keys", "install"}, 2, "the key is required"},
		{[]string{"gossip", "keys", "install", "--key", "c2hvcnQ="}, 2, "5 bytes, want 32"},
		{[]string{"gossip", "keys", "install", "--key", k1, "--key-file", keyFile}, 2, "not both"},
		{[]string{"gossip", "keys", "remove", "--key", k2}, 1, "the primary key cannot be removed"},
		{[]string{"gossip", "keys", "list", "extra"}, 2, "unexpected arguments"},
		{[]string{"gossip", "keys", "list", "--client-cert", "c.pem"}, 2, "--client-cert and --client-key go together"},
	}
	for _, c := range cases {
		_, code, err := runCLI(t, newApp(), append(c.args, admin...)...)
		if code != c.code || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: exit %d %v, want %d and %q", c.args, code, err, c.code, c.want)
		}
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"gossip", "keys", "list", "--admin", srv.URL}, 2, "--token (or MERIDIAN_ADMIN_TOKEN) is required"},
		{[]string{"gossip", "keys", "list", "--token", token}, 2, "--admin (or MERIDIAN_ADMIN) is required"},
		{[]string{"gossip", "keys", "list", "--admin", srv.URL, "--token", "wrong"}, 1, "missing or invalid bearer token (unauthorized)"},
		{[]string{"gossip", "keys", "list", "--admin", "http://127.0.0.1:1", "--token", token, "--timeout", "2s"}, 1, "cannot reach the admin API"},
	} {
		_, code, err := runCLI(t, newApp(), c.args...)
		if code != c.code || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: exit %d %v, want %d and %q", c.args, code, err, c.code, c.want)
		}
	}
}
