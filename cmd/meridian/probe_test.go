package main

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meridian-llm/meridian/global/identity"
)

// TestProbe: 2xx over https with the CA exits 0; a 503, an untrusted
// certificate, a refused connection and a bad URL do not.
func TestProbe(t *testing.T) {
	pki, err := identity.InitDevPKI(filepath.Join(t.TempDir(), "pki"), []string{"us-east-1"}, identity.PKIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"ready":false}`))
		}
	}))
	kp, err := tls.LoadX509KeyPair(pki.Controllers[0].Cert, pki.Controllers[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{kp}}
	srv.StartTLS()
	defer srv.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--ca-cert", pki.CACert, srv.URL + "/healthz"}, 0, ""},
		{[]string{"--ca-cert", pki.CACert, srv.URL + "/readyz"}, 1, "503 Service Unavailable: {\"ready\":false}"},
		{[]string{srv.URL + "/healthz"}, 1, "certificate"},
		{[]string{closed.URL + "/healthz"}, 1, "refused"},
		{[]string{"ftp://x/healthz"}, 2, "not an http or https URL"},
		{[]string{}, 2, "one URL is required"},
	} {
		app, out := quietApp()
		err := app.Run(append([]string{"meridian", "probe"}, tc.args...))
		if code := exitCode(err); code != tc.code || (tc.want != "" && !strings.Contains(err.Error()+out.String(), tc.want)) {
			t.Errorf("probe %v: exit %d (%v), want %d and %q", tc.args, code, err, tc.code, tc.want)
		}
	}
}
