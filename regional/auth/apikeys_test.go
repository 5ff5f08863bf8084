package auth_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/global/audit/audittest"
	"github.com/meridian-llm/meridian/regional/auth"
)

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func newKey(t testing.TB) (key, digest string) {
	t.Helper()
	k, d, err := auth.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k, d
}

// writeAtomic replaces a file the way a deployment tool does.
func writeAtomic(t testing.TB, name, content string) {
	t.Helper()
	if err := os.WriteFile(name+".tmp", []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(name+".tmp", name); err != nil {
		t.Fatal(err)
	}
}

func openAuth(t testing.TB, cfg auth.Config, deps auth.Deps) *auth.Authenticator {
	t.Helper()
	a, err := auth.Open(ctxT(t, 10*time.Second), cfg, deps)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		if err := a.Close(ctxT(t, 5*time.Second)); err != nil {
			t.Error(err)
		}
	})
	return a
}

func request(headers ...string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

// wantErr checks an Authenticate refusal: its kind and HTTP status.
func wantErr(t testing.TB, what string, err, kind error, status int) {
	t.Helper()
	var e *auth.Error
	if !errors.Is(err, kind) || !errors.As(err, &e) || e.Status != status || auth.Status(err) != status {
		t.Fatalf("%s: %v (status %d), want %v with %d", what, err, auth.Status(err), kind, status)
	}
}

func counterValue(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// TestAPIKeys: every way a key is presented, and every refusal.
func TestAPIKeys(t *testing.T) {
	acme, acmeDigest := newKey(t)
	globex, globexDigest := newKey(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "keys.yaml")
	writeAtomic(t, file, `keys:
  - name: acme-prod
    sha256: `+acmeDigest+`
    tenant: ACME
    data_classes: [general, PHI]
    default_data_class: general
    rate_limit: {requests_per_second: 5, burst: 10}
  - name: globex
    sha256: `+globexDigest+`
    tenant: globex
`)
	cfg := auth.DefaultConfig()
	cfg.Mode, cfg.APIKeys.File = auth.ModeAPIKeys, file
	reg := prometheus.NewRegistry()
	a := openAuth(t, cfg, auth.Deps{Registerer: reg})

	// A stock OpenAI SDK: Authorization: Bearer <apiKey>, nothing else.
	id, err := a.Authenticate(request("Authorization", "Bearer "+acme))
	if err != nil {
		t.Fatal(err)
	}
	want := auth.Identity{Name: "acme-prod", Tenant: "acme", DataClasses: []string{"general", "phi"}, DefaultDataClass: "general",
		DataClass: "general", RateLimit: auth.RateLimit{RequestsPerSecond: 5, Burst: 10}, Method: auth.MethodAPIKey}
	if !reflect.DeepEqual(id, want) {
		t.Fatalf("identity\n got %+v\nwant %+v", id, want)
	}
	// The same through X-Api-Key, with a lower-case scheme, with matching
	// redundant headers in other cases.
	for _, hs := range [][]string{
		{"X-Api-Key", acme},
		{"Authorization", "bearer " + acme},
		{"Authorization", "Bearer " + acme, "X-Api-Key", acme},
		{"Authorization", "Bearer " + acme, "X-Tenant-Id", "Acme"},
	} {
		if id, err := a.Authenticate(request(hs...)); err != nil || id.Name != "acme-prod" || id.DataClass != "general" {
			t.Fatalf("%v: %+v %v", hs, id, err)
		}
	}
	// X-Data-Class narrows within the allowed classes, in any case.
	if id, err := a.Authenticate(request("Authorization", "Bearer "+acme, "X-Data-Class", "PHI")); err != nil || id.DataClass != "phi" {
		t.Fatalf("narrowing to phi: %+v %v", id, err)
	}
	// An identity with no classes configured: no default, DataClass "".
	if id, err := a.Authenticate(request("Authorization", "Bearer "+globex)); err != nil || id.DataClass != "" || id.DataClasses != nil ||
		id.RateLimit != cfg.DefaultRateLimit {
		t.Fatalf("globex: %+v %v", id, err)
	}

	wantErr(t, "no credentials", errOf(a.Authenticate(request())), auth.ErrMissingCredentials, 401)
	wantErr(t, "empty bearer", errOf(a.Authenticate(request("Authorization", "Bearer  "))), auth.ErrMissingCredentials, 401)
	wantErr(t, "tenant header alone", errOf(a.Authenticate(request("X-Tenant-Id", "acme"))), auth.ErrMissingCredentials, 401)
	wantErr(t, "unknown key", errOf(a.Authenticate(request("Authorization", "Bearer "+strings.Repeat("x", 43)))), auth.ErrInvalidCredentials, 401)
	wantErr(t, "short key", errOf(a.Authenticate(request("Authorization", "Bearer "+acme[:31]))), auth.ErrInvalidCredentials, 401)
	wantErr(t, "basic auth", errOf(a.Authenticate(request("Authorization", "Basic "+acme))), auth.ErrInvalidCredentials, 401)
	wantErr(t, "two different keys", errOf(a.Authenticate(request("Authorization", "Bearer "+acme, "X-Api-Key", globex))), auth.ErrInvalidCredentials, 401)
	wantErr(t, "the digest as a key", errOf(a.Authenticate(request("Authorization", "Bearer "+acmeDigest))), auth.ErrInvalidCredentials, 401)
	wantErr(t, "another tenant", errOf(a.Authenticate(request("Authorization", "Bearer "+acme, "X-Tenant-Id", "globex"))), auth.ErrTenantMismatch, 403)
	wantErr(t, "two tenants", errOf(a.Authenticate(request("Authorization", "Bearer "+acme, "X-Tenant-Id", "acme", "X-Tenant-Id", "globex"))), auth.ErrTenantMismatch, 403)
	wantErr(t, "a class not allowed", errOf(a.Authenticate(request("Authorization", "Bearer "+acme, "X-Data-Class", "pci"))), auth.ErrDataClassNotAllowed, 403)
	wantErr(t, "a class for a key with none", errOf(a.Authenticate(request("Authorization", "Bearer "+globex, "X-Data-Class", "general"))), auth.ErrDataClassNotAllowed, 403)
	wantErr(t, "a malformed class", errOf(a.Authenticate(request("Authorization", "Bearer "+acme, "X-Data-Class", "phi general"))), auth.ErrDataClassNotAllowed, 403)

	if got := counterValue(t, reg, "meridian_auth_requests_total", map[string]string{"mode": "api_keys", "result": "tenant_mismatch"}); got != 2 {
		t.Fatalf("tenant_mismatch counted %v times, want 2", got)
	}
	if got := counterValue(t, reg, "meridian_auth_keys", nil); got != 2 {
		t.Fatalf("keys gauge %v", got)
	}
}

func errOf(_ auth.Identity, err error) error { return err }

// TestAPIKeysReload: a changed file is picked up by Reload and by the
// periodic check; an invalid file keeps the previous keys, is reported by
// Reload and counted once.
func TestAPIKeysReload(t *testing.T) {
	k1, d1 := newKey(t)
	k2, d2 := newKey(t)
	file := filepath.Join(t.TempDir(), "keys.yaml")
	writeAtomic(t, file, "keys:\n  - {name: one, tenant: a, sha256: "+d1+"}\n")
	cfg := auth.DefaultConfig()
	cfg.Mode, cfg.APIKeys.File = auth.ModeAPIKeys, file
	clock := audittest.NewClock(time.Now())
	reg := prometheus.NewRegistry()
	a := openAuth(t, cfg, auth.Deps{Clock: clock, Registerer: reg})
	auths := func(key string) bool {
		_, err := a.Authenticate(request("Authorization", "Bearer "+key))
		return err == nil
	}
	if !auths(k1) || auths(k2) {
		t.Fatal("initial key set")
	}
	// Reload on demand: k2 added, k1 revoked.
	writeAtomic(t, file, "keys:\n  - {name: two, tenant: b, sha256: "+d2+"}\n")
	if err := a.Reload(ctxT(t, time.Second)); err != nil {
		t.Fatal(err)
	}
	if auths(k1) || !auths(k2) {
		t.Fatal("after Reload: the revoked key works or the new one does not")
	}
	// The periodic check.
	writeAtomic(t, file, "keys:\n  - {name: one, tenant: a, sha256: "+d1+"}\n  - {name: two, tenant: b, sha256: "+d2+"}\n")
	if err := clock.WaitForWaiters(ctxT(t, 5*time.Second), 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(cfg.APIKeys.ReloadInterval)
	waitFor(t, 5*time.Second, "the periodic reload", func() bool { return auths(k1) })
	// An invalid file: the previous keys stay; Reload says why; the periodic
	// check does not count the same bytes again.
	writeAtomic(t, file, "keys:\n  - {name: one, tenant: a, sha256: nothex}\n")
	err := a.Reload(ctxT(t, time.Second))
	if err == nil || !strings.Contains(err.Error(), `sha256 "nothex"`) || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("Reload of an invalid file: %v", err)
	}
	if !auths(k1) || !auths(k2) {
		t.Fatal("an invalid file replaced the keys in use")
	}
	if err := clock.WaitForWaiters(ctxT(t, 5*time.Second), 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(cfg.APIKeys.ReloadInterval)
	if err := clock.WaitForWaiters(ctxT(t, 5*time.Second), 1); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, reg, "meridian_auth_reloads_total", map[string]string{"result": "error"}); got != 1 {
		t.Fatalf("error reloads %v, want 1", got)
	}
	// An empty file (a truncating writer caught mid-way) is refused too, and
	// so is a missing one.
	writeAtomic(t, file, "")
	if err := a.Reload(ctxT(t, time.Second)); err == nil || !auths(k1) {
		t.Fatalf("empty file: %v", err)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(ctxT(t, time.Second)); err == nil || !auths(k1) {
		t.Fatalf("missing file: %v", err)
	}
	if got := counterValue(t, reg, "meridian_auth_reloads_total", map[string]string{"result": "ok"}); got != 2 {
		t.Fatalf("ok reloads %v, want 2", got)
	}
	// Open refuses a bad file outright.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	writeAtomic(t, bad, "keys: [{name: x}]\n")
	cfg.APIKeys.File = bad
	if _, err := auth.Open(ctxT(t, time.Second), cfg, auth.Deps{}); err == nil {
		t.Fatal("Open accepted an invalid keys file")
	}
}

func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %v", what, within)
		}
		<-tick.C
	}
}
