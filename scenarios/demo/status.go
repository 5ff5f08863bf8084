package demo

import (
	_ "embed"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// statusPage is the status page: plain HTML and JavaScript polling
// /api/status, no build step.
//
//go:embed status.html
var statusPage []byte

// statusServer serves the read-only status page and its JSON endpoint.
type statusServer struct {
	ln   net.Listener
	srv  *http.Server
	done chan struct{}
	once sync.Once
	err  error
}

// StatusHandler returns the status page's handler: GET / is the page, GET
// /api/status the snapshot as JSON.
func StatusHandler(snapshot func() Snapshot) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(statusPage)
	})
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", " ")
		_ = enc.Encode(snapshot())
	})
	return mux
}

// startStatus listens on addr (on an ephemeral port of the same host if
// addr is taken) and serves the status page until Close.
func startStatus(addr string, h http.Handler) (*statusServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		host, _, serr := net.SplitHostPort(addr)
		if serr != nil {
			return nil, err
		}
		if ln, err = net.Listen("tcp", net.JoinHostPort(host, "0")); err != nil {
			return nil, err
		}
	}
	s := &statusServer{ln: ln, done: make(chan struct{}),
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	return s, nil
}

// URL is the page's address.
func (s *statusServer) URL() string { return "http://" + s.ln.Addr().String() + "/" }

// Close stops the server and waits for it. Safe to call twice.
func (s *statusServer) Close() error {
	s.once.Do(func() {
		err := s.srv.Close()
		<-s.done
		s.err = errors.Join(err, s.err)
	})
	return s.err
}
