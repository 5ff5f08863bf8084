package auth_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/global/audit/audittest"
	"github.com/meridian-llm/meridian/regional/auth"
)

// TestPrepareInstall: Prepare reads and checks a changed keys file without
// putting it in use (nil when unchanged, an error when invalid, nothing
// counted either way); Install puts it in use, once.
func TestPrepareInstall(t *testing.T) {
	k1, d1 := newKey(t)
	k2, d2 := newKey(t)
	file := filepath.Join(t.TempDir(), "keys.yaml")
	writeAtomic(t, file, "keys:\n  - {name: one, tenant: a, sha256: "+d1+"}\n")
	cfg := auth.DefaultConfig()
	cfg.Mode, cfg.APIKeys.File = auth.ModeAPIKeys, file
	reg := prometheus.NewRegistry()
	a := openAuth(t, cfg, auth.Deps{Clock: audittest.NewClock(time.Now()), Registerer: reg})
	auths := func(key string) bool {
		_, err := a.Authenticate(request("Authorization", "Bearer "+key))
		return err == nil
	}
	if u, err := a.Prepare(ctxT(t, time.Second)); u != nil || err != nil {
		t.Fatalf("unchanged file: %v, %v", u, err)
	}
	writeAtomic(t, file, "keys:\n  - {name: one, tenant: a, sha256: nothex}\n")
	if u, err := a.Prepare(ctxT(t, time.Second)); u != nil || err == nil || !strings.Contains(err.Error(), "nothex") {
		t.Fatalf("invalid file: %v, %v", u, err)
	}
	writeAtomic(t, file, "keys:\n  - {name: two, tenant: b, sha256: "+d2+"}\n")
	u, err := a.Prepare(ctxT(t, time.Second))
	if err != nil || u == nil {
		t.Fatalf("changed file: %v, %v", u, err)
	}
	if ch := u.Change(); ch.Source != "api_keys" || ch.Location != file || ch.Keys != 1 || len(ch.SHA256) != 64 || len(ch.Previous) != 64 || ch.SHA256 == ch.Previous {
		t.Fatalf("change %+v", ch)
	}
	if !auths(k1) || auths(k2) {
		t.Fatal("Prepare put the new keys in use")
	}
	if got := counterValue(t, reg, "meridian_auth_reloads_total", map[string]string{"result": "error"}); got != 0 {
		t.Fatalf("Prepare counted %v errors", got)
	}
	if err := u.Install(ctxT(t, time.Second)); err != nil {
		t.Fatal(err)
	}
	if auths(k1) || !auths(k2) {
		t.Fatal("after Install: the old key works or the new one does not")
	}
	if err := u.Install(ctxT(t, time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, reg, "meridian_auth_reloads_total", map[string]string{"result": "ok"}); got != 1 {
		t.Fatalf("ok reloads %v, want 1 (a second Install does nothing)", got)
	}
}

// TestGuard: every reload after the first load goes through the guard,
// which sees the change before it takes effect; a guard that refuses keeps
// the previous keys and is counted as an error.
func TestGuard(t *testing.T) {
	k1, d1 := newKey(t)
	k2, d2 := newKey(t)
	file := filepath.Join(t.TempDir(), "keys.yaml")
	writeAtomic(t, file, "keys:\n  - {name: one, tenant: a, sha256: "+d1+"}\n")
	cfg := auth.DefaultConfig()
	cfg.Mode, cfg.APIKeys.File = auth.ModeAPIKeys, file
	reg := prometheus.NewRegistry()
	var seen []auth.Change
	refuse := errors.New("the audit log is full")
	var refusing bool
	var a *auth.Authenticator
	a = openAuth(t, cfg, auth.Deps{Clock: audittest.NewClock(time.Now()), Registerer: reg,
		Guard: func(_ context.Context, ch auth.Change, install func()) error {
			seen = append(seen, ch)
			if _, err := a.Authenticate(request("Authorization", "Bearer "+k2)); err == nil {
				t.Error("the new keys were in use before the guard installed them")
			}
			if refusing {
				return refuse
			}
			install()
			return nil
		}})
	if len(seen) != 0 {
		t.Fatalf("the first load went through the guard: %+v", seen)
	}
	auths := func(key string) bool {
		_, err := a.Authenticate(request("Authorization", "Bearer "+key))
		return err == nil
	}
	writeAtomic(t, file, "keys:\n  - {name: two, tenant: b, sha256: "+d2+"}\n")
	refusing = true
	if err := a.Reload(ctxT(t, time.Second)); !errors.Is(err, refuse) {
		t.Fatalf("refused by the guard: %v", err)
	}
	if !auths(k1) || auths(k2) {
		t.Fatal("a set the guard refused is in use")
	}
	refusing = false
	if err := a.Reload(ctxT(t, time.Second)); err != nil {
		t.Fatal(err)
	}
	if auths(k1) || !auths(k2) || len(seen) != 2 || seen[1].Keys != 1 {
		t.Fatalf("after the guard installed it: %+v", seen)
	}
	if ok, bad := counterValue(t, reg, "meridian_auth_reloads_total", map[string]string{"result": "ok"}),
		counterValue(t, reg, "meridian_auth_reloads_total", map[string]string{"result": "error"}); ok != 1 || bad != 1 {
		t.Fatalf("reloads ok %v error %v, want 1 and 1", ok, bad)
	}
}
