package regional

import (
	"net/http"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	http.DefaultClient.Transport = syncedTransport{http.DefaultTransport}
	goleak.VerifyTestMain(m)
}

// fixtureSync gives the race detector the order that a loopback socket
// gives a test: what the test did to a server before sending it a request
// happens before the handler that serves it, and what that handler did
// happens before the test reads the answer. The detector cannot see
// through a socket; net/http's server happened to order such accesses
// through the pools it shares with the client, h1Server does not. The
// test side is http.DefaultClient's transport (syncedTransport); the
// server side is the fixtures' handler (syncedHandler).
var fixtureSync sync.Mutex

func touchFixtureSync() {
	fixtureSync.Lock()
	//lint:ignore SA2001 the lock is the point: a happens-before edge.
	fixtureSync.Unlock()
}

type syncedTransport struct{ http.RoundTripper }

func (t syncedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	touchFixtureSync()
	resp, err := t.RoundTripper.RoundTrip(r)
	touchFixtureSync()
	return resp, err
}

// syncedHandler is h with fixtureSync taken as each request starts and
// ends.
func syncedHandler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		touchFixtureSync()
		defer touchFixtureSync()
		h.ServeHTTP(w, r)
	})
}
