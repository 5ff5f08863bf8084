package regional

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ListenerConfig bounds what one client can hold of a listener: a client
// that sends its headers or body slowly, or keeps idle connections open,
// is cut off, and past MaxConnections new connections are closed at once.
// A flood of slow connections on the API listener may degrade the API,
// but never the admin listener (its own limits), Raft, gossip or Kafka.
type ListenerConfig struct {
	// ReadHeaderTimeout to receive a request's headers. Default 10s.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// ReadTimeout to receive a whole request, body included (a prompt of
	// max_body_bytes must arrive within it). Default 60s.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// IdleTimeout closes a keep-alive connection idle this long. Default 120s.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxConnections open at once; more are closed as they arrive.
	// Default 8192 for the API, 256 for the admin API.
	MaxConnections int `yaml:"max_connections"`
	// MaxHeaderBytes of a request's headers. Default 64 KiB.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
}

// DefaultAPIListener and DefaultAdminListener are the defaults of the two
// listeners.
func DefaultAPIListener() ListenerConfig {
	return ListenerConfig{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 60 * time.Second, IdleTimeout: 120 * time.Second,
		MaxConnections: 8192, MaxHeaderBytes: 64 << 10}
}

// DefaultAdminListener: see DefaultAPIListener.
func DefaultAdminListener() ListenerConfig {
	l := DefaultAPIListener()
	l.MaxConnections = 256
	return l
}

// Validate names the first field that is wrong.
func (c ListenerConfig) Validate(section string) error {
	switch {
	case c.ReadHeaderTimeout <= 0 || c.ReadTimeout <= 0 || c.IdleTimeout <= 0:
		return fmt.Errorf("%s: read_header_timeout, read_timeout and idle_timeout must be > 0", section)
	case c.ReadHeaderTimeout > c.ReadTimeout:
		return fmt.Errorf("%s: read_header_timeout %v is longer than read_timeout %v", section, c.ReadHeaderTimeout, c.ReadTimeout)
	case c.MaxConnections < 1:
		return fmt.Errorf("%s: max_connections = %d: want >= 1", section, c.MaxConnections)
	case c.MaxHeaderBytes < 4<<10:
		return fmt.Errorf("%s: max_header_bytes = %d: want >= 4096", section, c.MaxHeaderBytes)
	}
	return nil
}

// listenerMetrics count the connections of the controller's listeners.
type listenerMetrics struct {
	open     *prometheus.GaugeVec   // listener
	rejected *prometheus.CounterVec // listener
}

func newListenerMetrics(r prometheus.Registerer) (*listenerMetrics, error) {
	m := &listenerMetrics{
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_listener_connections",
			Help: "Connections open on each listener (api, admin)."}, []string{"listener"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_listener_rejected_connections_total",
			Help: "Connections closed on arrival because the listener held max_connections."}, []string{"listener"}),
	}
	for _, c := range []prometheus.Collector{m.open, m.rejected} {
		if err := r.Register(c); err != nil {
			return nil, fmt.Errorf("register listener metrics: %w", err)
		}
	}
	for _, l := range []string{"api", "admin"} {
		m.open.WithLabelValues(l)
		m.rejected.WithLabelValues(l)
	}
	return m, nil
}

// serve wraps ln for one listener: at most cfg.MaxConnections open (more
// are closed on arrival), then TLS when tlsCfg is set; and returns the
// http.Server with the listener's timeouts. Serve it on the returned
// listener. The admin listener's server.
func serve(name string, ln net.Listener, cfg ListenerConfig, tlsCfg *tls.Config, h http.Handler, m *listenerMetrics, log *slog.Logger) (*http.Server, net.Listener) {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		// No WriteTimeout: an answer streams as long as generation takes.
		ErrorLog: slog.NewLogLogger(log.With("listener", name).Handler(), slog.LevelDebug),
	}
	return srv, wrapListener(name, ln, cfg, tlsCfg, m)
}

// serveAPI is serve for the API listener, whose server is an h1Server
// (the proxy's fast path: see h1Server).
func serveAPI(ln net.Listener, cfg ListenerConfig, tlsCfg *tls.Config, h http.Handler, m *listenerMetrics, log *slog.Logger) (*h1Server, net.Listener) {
	srv := &h1Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          log.With("listener", "api"),
	}
	return srv, wrapListener("api", ln, cfg, tlsCfg, m)
}

func wrapListener(name string, ln net.Listener, cfg ListenerConfig, tlsCfg *tls.Config, m *listenerMetrics) net.Listener {
	var l net.Listener = &capListener{Listener: ln, max: int64(cfg.MaxConnections), open: m.open.WithLabelValues(name),
		rejected: m.rejected.WithLabelValues(name)}
	if tlsCfg != nil {
		l = tls.NewListener(l, tlsCfg)
	}
	return l
}

// capListener closes connections past max as they are accepted, so that a
// flood of slow clients holds at most max file descriptors of this
// listener and cannot starve the process of them.
type capListener struct {
	net.Listener
	max      int64
	n        atomic.Int64
	open     prometheus.Gauge
	rejected prometheus.Counter
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.n.Add(1) > l.max {
			l.n.Add(-1)
			l.rejected.Inc()
			c.Close()
			continue
		}
		l.open.Inc()
		return &cappedConn{Conn: c, rw: rawReadAhead(c), l: l}, nil
	}
}

type cappedConn struct {
	net.Conn
	rw   io.ReadWriter // c's I/O: rawReadAhead
	l    *capListener
	once sync.Once
}

func (c *cappedConn) Read(p []byte) (int, error)  { return c.rw.Read(p) }
func (c *cappedConn) Write(p []byte) (int, error) { return c.rw.Write(p) }

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.n.Add(-1)
		c.l.open.Dec()
	})
	return err
}

// errServerClosed tells a listener's goroutine that Shutdown stopped it.
func servedUntilClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
