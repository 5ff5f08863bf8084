// Package discoverytest runs an in-process DNS server on loopback (UDP and
// TCP on one port) that answers as Kubernetes' CoreDNS does for headless
// Services, so tests of discovery, the controller and the bridge can add
// and remove pods while a source follows them. Test code only; it imports
// nothing of ours.
package discoverytest

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"
)

// Service is a headless Service as its DNS records show it.
type Service struct {
	// Name is its fully qualified name, e.g. "vllm.inference.svc.cluster.local.".
	Name string
	// Ports each publish SRV records _<name>._<proto>.<Service.Name>, one
	// per pod, with target <pod host name>.<Service.Name>.
	Ports []Port
	// Pods are the ready pods: an A or AAAA record each at Name and at
	// their host name.
	Pods []Pod
	// TTL of every record; 0 means 0 (never cache), as a test may want.
	TTL uint32
}

// Port is one named port of a Service.
type Port struct {
	Name  string // e.g. "http"
	Proto string // "tcp" (default) or "udp"
	Port  uint16
}

// Pod is one ready pod of a Service.
type Pod struct {
	IP netip.Addr
	// Hostname is its host name label; "" = its IP with dashes
	// (10-0-3-7), as CoreDNS names a pod without spec.hostname.
	Hostname string
}

// Server is the DNS server. Its methods are safe for concurrent use.
type Server struct {
	udp, tcp *dns.Server
	wg       sync.WaitGroup
	addr     string

	mu      sync.Mutex
	records map[question][]dns.RR // the answer to each name and type
	names   map[string]bool       // names that exist (others: NXDOMAIN)
	rcode   int                   // when not success, every answer's rcode

	queries    atomic.Int64
	tcpQueries atomic.Int64
}

type question struct {
	name  string // lower case, fully qualified
	qtype uint16
}

// Start runs a server on 127.0.0.1 until the test ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	s := &Server{records: map[question][]dns.RR{}, names: map[string]bool{}}
	var pc net.PacketConn
	var ln net.Listener
	for attempt := 0; ; attempt++ {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			tb.Fatalf("discoverytest: listen udp: %v", err)
		}
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
		if attempt == 10 {
			tb.Fatalf("discoverytest: listen tcp beside udp: %v", err)
		}
	}
	s.addr = pc.LocalAddr().String()
	started := make(chan struct{}, 2)
	notify := func() { started <- struct{}{} }
	s.udp = &dns.Server{PacketConn: pc, Handler: s, NotifyStartedFunc: notify}
	s.tcp = &dns.Server{Listener: ln, Handler: s, NotifyStartedFunc: notify}
	for _, srv := range []*dns.Server{s.udp, s.tcp} {
		s.wg.Go(func() { _ = srv.ActivateAndServe() })
	}
	<-started
	<-started
	tb.Cleanup(func() {
		_ = s.udp.Shutdown()
		_ = s.tcp.Shutdown()
		s.wg.Wait()
	})
	return s
}

// Addr is the server's host:port, for discovery's dns.server.
func (s *Server) Addr() string { return s.addr }

// Queries returns how many queries the server has answered.
func (s *Server) Queries() int64 { return s.queries.Load() }

// TCPQueries returns how many of them came over TCP.
func (s *Server) TCPQueries() int64 { return s.tcpQueries.Load() }

// SetRcode makes every answer carry rcode (dns.RcodeServerFailure,
// dns.RcodeRefused) and no records; dns.RcodeSuccess answers from the
// records again.
func (s *Server) SetRcode(rcode int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rcode = rcode
}

// SetService replaces every record at or under svc.Name with svc's. A
// Service with no pod keeps its name (answers: no records) as CoreDNS does
// for a Service without ready endpoints.
func (s *Server) SetService(svc Service) {
	base := dns.CanonicalName(svc.Name)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.remove(base)
	s.names[base] = true
	hdr := func(name string, t uint16) dns.RR_Header {
		return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: svc.TTL}
	}
	addr := func(name string, ip netip.Addr) dns.RR {
		if ip.Is4() {
			return &dns.A{Hdr: hdr(name, dns.TypeA), A: ip.AsSlice()}
		}
		return &dns.AAAA{Hdr: hdr(name, dns.TypeAAAA), AAAA: ip.AsSlice()}
	}
	add := func(name string, rr dns.RR) {
		q := question{name, rr.Header().Rrtype}
		s.records[q] = append(s.records[q], rr)
		s.names[name] = true
	}
	for _, p := range svc.Pods {
		host := p.Hostname
		if host == "" {
			host = strings.NewReplacer(".", "-", ":", "-").Replace(p.IP.String())
		}
		target := dns.CanonicalName(host + "." + base)
		add(base, addr(base, p.IP))
		add(target, addr(target, p.IP))
		for _, port := range svc.Ports {
			proto := port.Proto
			if proto == "" {
				proto = "tcp"
			}
			name := dns.CanonicalName("_" + port.Name + "._" + proto + "." + base)
			add(name, &dns.SRV{Hdr: hdr(name, dns.TypeSRV), Priority: 0, Weight: 10, Port: port.Port, Target: target})
		}
	}
	for _, port := range svc.Ports {
		proto := port.Proto
		if proto == "" {
			proto = "tcp"
		}
		s.names[dns.CanonicalName("_"+port.Name+"._"+proto+"."+base)] = true
	}
}

// RemoveService removes every record at or under name: queries for them
// get NXDOMAIN.
func (s *Server) RemoveService(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.remove(dns.CanonicalName(name))
}

func (s *Server) remove(base string) {
	under := func(n string) bool { return n == base || strings.HasSuffix(n, "."+base) }
	for q := range s.records {
		if under(q.name) {
			delete(s.records, q)
		}
	}
	for n := range s.names {
		if under(n) {
			delete(s.names, n)
		}
	}
}

// ServeDNS answers one query: the records of its name and type, NXDOMAIN
// for an unknown name, truncated to the client's UDP size (so large
// answers make it retry over TCP).
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	s.queries.Add(1)
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if len(req.Question) == 1 {
		q := req.Question[0]
		name := dns.CanonicalName(q.Name)
		s.mu.Lock()
		switch {
		case s.rcode != dns.RcodeSuccess:
			m.Rcode = s.rcode
		case !s.names[name]:
			m.Rcode = dns.RcodeNameError
		default:
			for _, rr := range s.records[question{name, q.Qtype}] {
				m.Answer = append(m.Answer, dns.Copy(rr))
			}
		}
		s.mu.Unlock()
	} else {
		m.Rcode = dns.RcodeFormatError
	}
	if _, udp := w.RemoteAddr().(*net.UDPAddr); !udp {
		s.tcpQueries.Add(1)
	} else {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = int(opt.UDPSize())
		}
		m.Truncate(size)
	}
	_ = w.WriteMsg(m)
}
