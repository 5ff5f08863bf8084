package gossip

import (
	"encoding/base64"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/coordinate"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-llm/meridian/gorgo"
	"github.com/meridian-llm/meridian/regional/summary"
)

func TestDefaultConfigValidates(t *testing.T) {
	cfg := DefaultConfig()
	cfg.NodeName, cfg.Region, cfg.Keys = "c1", "us-east-1", []string{newKey(t)}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestConfigValidateNamesField: each bad field gets an error naming it.
func TestConfigValidateNamesField(t *testing.T) {
	good := DefaultConfig()
	good.NodeName, good.Region, good.Keys = "c1", "us-east-1", []string{newKey(t)}
	cases := []struct {
		field string
		edit  func(*Config)
	}{
		{"NodeName", func(c *Config) { c.NodeName = "" }},
		{"NodeName", func(c *Config) { c.NodeName = "has space" }},
		{"Region", func(c *Config) { c.Region = strings.Repeat("r", 65) }},
		{"BindAddr", func(c *Config) { c.BindAddr = "localhost" }},
		{"BindPort", func(c *Config) { c.BindPort = 70000 }},
		{"AdvertiseAddr", func(c *Config) { c.AdvertiseAddr = "example.com" }},
		{"Join[0]", func(c *Config) { c.Join = []string{"no-port"} }},
		{"Label", func(c *Config) { c.Label = "" }},
		{"Keys", func(c *Config) { c.Keys = nil }},
		{"Keys[0]", func(c *Config) { c.Keys = []string{"not base64!"} }},
		{"Keys[0]", func(c *Config) { c.Keys = []string{"c2hvcnQ="} }},
		{"Keys[0]: 16 bytes, want 32", func(c *Config) { c.Keys = []string{base64.StdEncoding.EncodeToString(make([]byte, 16))} }},
		{"Keys[1]: 24 bytes, want 32", func(c *Config) { c.Keys = append(c.Keys, base64.StdEncoding.EncodeToString(make([]byte, 24))) }},
		{"KeyOpTimeout", func(c *Config) { c.KeyOpTimeout = 0 }},
		{"ForwardAddr", func(c *Config) { c.ForwardAddr = strings.Repeat("x", 201) }},
		{"ProbeTimeout", func(c *Config) { c.ProbeTimeout = c.ProbeInterval }},
		{"SyncInterval", func(c *Config) { c.SyncInterval = 0 }},
		{"SightingInterval", func(c *Config) { c.SightingInterval = 0 }},
		{"MaxSummaryBytes", func(c *Config) { c.MaxSummaryBytes = 10 }},
		{"RTTMinSamples", func(c *Config) { c.RTTMinSamples = c.RTTWindow + 1 }},
		{"Coordinate", func(c *Config) { cc := coordinate.DefaultConfig(); cc.Dimensionality = 99; c.Coordinate = cc }},
		{"StaticRTT[0]", func(c *Config) { c.StaticRTT = []StaticRTT{{A: "a", B: "a", RTT: time.Millisecond}} }},
		{"StaticRTT[0]", func(c *Config) { c.StaticRTT = []StaticRTT{{A: "a", B: "b", RTT: -time.Millisecond}} }},
		{"StaticRTT[1]", func(c *Config) {
			c.StaticRTT = []StaticRTT{{A: "a", B: "b", RTT: time.Millisecond}, {A: "b", B: "a", RTT: 2 * time.Millisecond}}
		}},
	}
	for _, c := range cases {
		cfg := good
		c.edit(&cfg)
		err := cfg.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: err = %v", c.field, err)
		}
	}
}

// TestDigestFitsNodeMeta: the largest digest the config allows stays under
// memberlist's 512-byte limit (beyond which memberlist panics).
func TestDigestFitsNodeMeta(t *testing.T) {
	d := Digest{
		Region: strings.Repeat("r", summary.MaxRegionLen), Generation: math.MaxUint64, BodyHash: math.MaxUint64,
		BodyLen: math.MaxUint32, Pods: math.MaxUint32, Running: math.MaxUint32, Slots: math.MaxUint32,
		Pending: math.MaxUint64, FreeKV: math.MaxUint64, ForwardAddr: strings.Repeat("f", maxForwardAddrLen),
	}
	b, err := d.encode()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > memberlist.MetaMaxSize {
		t.Fatalf("largest digest is %d bytes", len(b))
	}
	t.Logf("largest digest: %d bytes of %d", len(b), memberlist.MetaMaxSize)
	got, err := decodeDigest(b)
	if err != nil || got != d {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if _, err := (&Digest{Region: strings.Repeat("r", 300)}).encode(); err == nil {
		t.Fatal("an oversize digest was encoded")
	}
}

// TestWireRejects: malformed digests, pull requests, push/pull states and
// coordinates are refused with errors.
// The framing constants the byte counters subtract are the encoders' own.
func TestFramingHeaderLengths(t *testing.T) {
	body := []byte("summary body")
	if got := len(encodeSummaryMsg(body)) - len(body); got != msgHeaderLen {
		t.Errorf("summary message header %d bytes, msgHeaderLen %d", got, msgHeaderLen)
	}
	if got := len(encodeLocalState(body)) - len(body); got != stateHeaderLen {
		t.Errorf("push/pull state header %d bytes, stateHeaderLen %d", got, stateHeaderLen)
	}
	if got, err := decodeLocalState(encodeLocalState(body)); err != nil || string(got) != string(body) {
		t.Errorf("push/pull state round trip: %q %v", got, err)
	}
	if m := (want{From: "a", Region: "r", Generation: 3}).encode(); len(m) < msgHeaderLen || m[0] != msgWant || m[1] != wireVersion {
		t.Errorf("pull request header % x", m)
	}
}

func TestWireRejects(t *testing.T) {
	good, _ := (&Digest{Region: "us-east-1", Generation: 3}).encode()
	for name, b := range map[string][]byte{
		"empty":     nil,
		"version":   append([]byte{9}, good[1:]...),
		"truncated": good[:len(good)-3],
		"trailing":  append(append([]byte(nil), good...), 0),
		"no region": append([]byte{digestVersion, 0}, good[2+len("us-east-1"):]...),
	} {
		if _, err := decodeDigest(b); !errors.Is(err, errWire) {
			t.Errorf("digest %s: err = %v", name, err)
		}
	}
	w := want{From: "a", Region: "r", Generation: 1}.encode()
	if _, err := decodeWant(w[:len(w)-1]); !errors.Is(err, errWire) {
		t.Errorf("truncated want: %v", err)
	}
	if _, err := decodeLocalState([]byte{stateVersion, 10, 0, 0, 0, 1}); !errors.Is(err, errWire) {
		t.Errorf("short state: %v", err)
	}
	if _, err := decodeLocalState([]byte{7, 0, 0, 0, 0}); !errors.Is(err, errWire) {
		t.Errorf("state version: %v", err)
	}
	c := coordinate.NewCoordinate(coordinate.DefaultConfig())
	enc := encodeCoordinate(c)
	if got, err := decodeCoordinate(enc, 8); err != nil || len(got.Vec) != 8 {
		t.Fatalf("good coordinate: %v", err)
	}
	nan := coordinate.NewCoordinate(coordinate.DefaultConfig())
	nan.Vec[3] = math.NaN()
	inf := coordinate.NewCoordinate(coordinate.DefaultConfig())
	inf.Height = math.Inf(1)
	neg := coordinate.NewCoordinate(coordinate.DefaultConfig())
	neg.Height = -1
	three := coordinate.DefaultConfig()
	three.Dimensionality = 3
	for name, b := range map[string][]byte{
		"dimensions": encodeCoordinate(coordinate.NewCoordinate(three)),
		"nan":        encodeCoordinate(nan),
		"inf":        encodeCoordinate(inf),
		"negative":   encodeCoordinate(neg),
		"truncated":  enc[:len(enc)-1],
		"version":    append([]byte{9}, enc[1:]...),
		"empty":      nil,
	} {
		if _, err := decodeCoordinate(b, 8); !errors.Is(err, errWire) {
			t.Errorf("coordinate %s: err = %v", name, err)
		}
	}
}

// bareNode is a Node without memberlist, for the pure parts (receive,
// rebuild, RTT ladder, liveness).
func bareNode(t *testing.T, cfg Config, now *time.Time) *Node {
	t.Helper()
	coord, err := coordinate.NewClient(coordinate.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{
		cfg: cfg, log: testLogger(t), now: func() time.Time { return *now }, m: newMetrics(prometheus.NewRegistry()),
		coord: coord, dims: 8, static: map[string]time.Duration{}, peers: map[string]*peer{}, regions: map[string]*held{},
		ages: map[string]reported{}, pending: map[string]pull{}, warned: map[string]bool{}, kick: make(chan struct{}, 1), sends: make(chan sendJob, 8),
	}
	for _, e := range cfg.StaticRTT {
		if e.A == cfg.Region {
			n.static[e.B] = e.RTT
		} else if e.B == cfg.Region {
			n.static[e.A] = e.RTT
		}
	}
	return n
}

func addPeer(n *Node, name, region string, samples ...time.Duration) *peer {
	p := n.peerLocked(name)
	p.digest, p.digestOK = Digest{Region: region, Generation: 1}, true
	p.seen = n.now()
	p.samples = append(p.samples, samples...)
	return p
}

// TestBadBodiesRejected: every kind of bad summary body is rejected with
// an error, counted by reason, and leaves the held summary alone.
func TestBadBodiesRejected(t *testing.T) {
	now := time.Now()
	cfg := testConfig(t, "a", "us-east-1", newKey(t))
	cfg.MaxSummaryBytes = 32 << 10
	n := bareNode(t, cfg, &now)
	good, _ := buildSummary(t, "us-west-2", 5, 1000).MarshalBinary()
	if err := n.receive(good, "pull"); err != nil {
		t.Fatal(err)
	}
	flipped := append([]byte(nil), good...)
	flipped[len(flipped)/2] ^= 0x40
	big := buildSummary(t, "us-west-2", 6, 1000)
	bigBody, _ := big.MarshalBinary()
	bigBody = append(bigBody, make([]byte, 40<<10)...) // over MaxSummaryBytes
	cases := []struct {
		reason string
		body   []byte
	}{
		{"oversize", bigBody},
		{"checksum", flipped},
		{"truncated", good[:30]},
		{"magic", []byte("GARBAGE GARBAGE GARBAGE")},
		{"version", append([]byte("MRSM\x07"), good[5:]...)},
	}
	for _, c := range cases {
		before := counter(t, n.m.rejected.WithLabelValues(c.reason))
		if err := n.receive(c.body, "pull"); err == nil {
			t.Errorf("%s: accepted", c.reason)
		}
		if got := counter(t, n.m.rejected.WithLabelValues(c.reason)); got != before+1 {
			t.Errorf("%s: counter %v -> %v", c.reason, before, got)
		}
	}
	// Malformed framing through the delegates.
	(*delegate)(n).NotifyMsg([]byte{msgSummary})
	(*delegate)(n).NotifyMsg([]byte{99, wireVersion})
	(*delegate)(n).MergeRemoteState([]byte{stateVersion, 0xff, 0xff, 0, 0}, false)
	if got := counter(t, n.m.rejected.WithLabelValues("malformed")); got != 3 {
		t.Errorf("malformed counter %v, want 3", got)
	}
	// A stale or duplicate body is ignored, not an error.
	older, _ := buildSummary(t, "us-west-2", 4, 1000).MarshalBinary()
	if err := n.receive(older, "push/pull"); err != nil {
		t.Fatal(err)
	}
	if err := n.receive(good, "push/pull"); err != nil {
		t.Fatal(err)
	}
	// The body held, resent (push/pull does every exchange), is recognised
	// by its hash without being decoded: nothing is allocated.
	if !raceEnabled {
		if a := testing.AllocsPerRun(20, func() { _ = n.receive(good, "push/pull") }); a != 0 {
			t.Errorf("receiving the held body again allocates %v times", a)
		}
	}
	// Our own region's summary (from a sibling controller) is not kept.
	own, _ := buildSummary(t, "us-east-1", 9, 100).MarshalBinary()
	if err := n.receive(own, "push/pull"); err != nil {
		t.Fatal(err)
	}
	v := n.View()
	if r, ok := v.Region("us-west-2"); !ok || r.Summary.Generation != 5 || r.Via != "pull" {
		t.Fatalf("held summary changed: %+v", r)
	}
	if _, ok := v.Region("us-east-1"); ok {
		t.Fatal("own region's summary kept")
	}
	if got := counter(t, n.m.accepted); got != 1 {
		t.Fatalf("accepted %v, want 1", got)
	}
}

// TestRTTLadder: override, measured (direct, then Vivaldi), static
// fallback, unknown.
func TestRTTLadder(t *testing.T) {
	now := time.Now()
	cfg := testConfig(t, "a", "us-east-1", newKey(t))
	cfg.StaticRTT = []StaticRTT{{A: "us-west-2", B: "us-east-1", RTT: 70 * time.Millisecond}, {A: "eu-west-1", B: "ap-southeast-1", RTT: time.Second}}
	n := bareNode(t, cfg, &now)
	ms := time.Millisecond
	n.mu.Lock()
	addPeer(n, "w1", "us-west-2", 60*ms, 62*ms, 61*ms)
	addPeer(n, "w2", "us-west-2", 80*ms, 81*ms, 79*ms)
	addPeer(n, "w3", "us-west-2", 70*ms) // too few samples, no coordinate: not counted
	addPeer(n, "e1", "eu-west-1")        // nothing measured, no static entry from us-east-1
	addPeer(n, "p1", "ap-southeast-1", 200*ms, 210*ms)
	n.rebuildLocked()
	n.mu.Unlock()
	v := n.View()
	west, _ := v.Region("us-west-2")
	if west.RTTSource != RTTDirect || west.RTT != 80*ms || west.DirectRTT != 80*ms {
		t.Fatalf("us-west-2: %v %s (upper median of 61 and 80 ms)", west.RTT, west.RTTSource)
	}
	eu, _ := v.Region("eu-west-1")
	if eu.RTTSource != RTTNone {
		t.Fatalf("eu-west-1: %v %s", eu.RTT, eu.RTTSource)
	}
	if _, ok := eu.Candidate(now, nil, 10, nil); ok {
		t.Fatal("a region of unknown RTT is a candidate")
	}
	if v.Regions[len(v.Regions)-1].Region != "eu-west-1" {
		t.Fatalf("unknown RTT not sorted last: %v", v.Regions)
	}
	// Vivaldi: a converged own coordinate and a peer coordinate.
	n.mu.Lock()
	own := n.coord.GetCoordinate()
	own.Error = 0.1
	if err := n.coord.SetCoordinate(own); err != nil {
		t.Fatal(err)
	}
	pc := coordinate.NewCoordinate(coordinate.DefaultConfig())
	pc.Vec[0] = 0.2
	n.peers["p1"].coord = pc
	n.rebuildLocked()
	n.mu.Unlock()
	ap, _ := n.View().Region("ap-southeast-1")
	if ap.RTTSource != RTTVivaldi || ap.RTT < 190*ms || ap.RTT > 210*ms {
		t.Fatalf("ap-southeast-1 via Vivaldi: %v %s", ap.RTT, ap.RTTSource)
	}
	// Static as fallback: us-west-2 loses its measurements.
	n.mu.Lock()
	n.peers["w1"].dead = true
	n.peers["w2"].dead = true
	n.peers["w3"].dead = true
	n.rebuildLocked()
	n.mu.Unlock()
	if west, _ := n.View().Region("us-west-2"); west.RTTSource != RTTStatic || west.RTT != 70*ms || west.Live {
		t.Fatalf("fallback: %v %s live %v", west.RTT, west.RTTSource, west.Live)
	}
	// Static as override.
	n.cfg.StaticRTTOverride = true
	n.mu.Lock()
	n.peers["w1"].dead = false
	n.rebuildLocked()
	n.mu.Unlock()
	if west, _ := n.View().Region("us-west-2"); west.RTTSource != RTTStatic || west.RTT != 70*ms || west.DirectRTT != 61*ms {
		t.Fatalf("override: %v %s direct %v", west.RTT, west.RTTSource, west.DirectRTT)
	}
}

// TestSuspectAndLive: a controller that stops answering pings turns
// suspect after SuspectAfterProbes rounds; a region whose controllers are
// all suspect or dead is not Live; a ping answer brings it back.
func TestSuspectAndLive(t *testing.T) {
	now := time.Now()
	cfg := testConfig(t, "a", "us-east-1", newKey(t))
	cfg.SuspectAfterProbes = 3
	n := bareNode(t, cfg, &now)
	n.mu.Lock()
	addPeer(n, "w1", "us-west-2")
	d := addPeer(n, "w2", "us-west-2")
	d.dead = true
	n.rebuildLocked()
	n.mu.Unlock()
	if w, _ := n.View().Region("us-west-2"); !w.Live || w.Alive != 1 {
		t.Fatalf("fresh: %+v", w)
	}
	// One other controller alive: a round is one ProbeInterval.
	now = now.Add(3*cfg.ProbeInterval + cfg.ProbeTimeout + time.Millisecond)
	n.mu.Lock()
	n.rebuildLocked()
	n.mu.Unlock()
	w, _ := n.View().Region("us-west-2")
	if w.Live || w.Alive != 0 || w.Controllers[0].State != StateSuspect || w.Controllers[1].State != StateDead {
		t.Fatalf("silent: %+v", w)
	}
	if got := counter(t, n.m.members.WithLabelValues("suspect")); got != 1 {
		t.Fatalf("suspect gauge %v", got)
	}
	(*pings)(n).NotifyPingComplete(&memberlist.Node{Name: "w1"}, 60*time.Millisecond, encodeCoordinate(coordinate.NewCoordinate(coordinate.DefaultConfig())))
	n.mu.Lock()
	n.rebuildLocked()
	n.mu.Unlock()
	if w, _ := n.View().Region("us-west-2"); !w.Live {
		t.Fatalf("answered again: %+v", w)
	}
	// A bad coordinate is counted and not used.
	(*pings)(n).NotifyPingComplete(&memberlist.Node{Name: "w1"}, 60*time.Millisecond, []byte{pingVersion, 3})
	if got := counter(t, n.m.coordsRejected); got != 1 {
		t.Fatalf("rejected coordinates %v", got)
	}
}

// TestRegionCandidate: the view's candidate carries the RTT and the age:
// the sender's reported age plus the time since receipt, whatever the
// summary's build time says on the remote clock.
func TestRegionCandidate(t *testing.T) {
	s := buildSummary(t, "us-west-2", 1, 1000)
	recv := s.BuiltAt.Add(-2 * time.Second) // the remote clock is 2s ahead
	r := RegionView{Region: "us-west-2", Summary: s, ReceivedAt: recv, Live: true, Alive: 1, RTT: 65 * time.Millisecond, RTTSource: RTTDirect,
		Controllers: []Controller{{Name: "ctl-us-west-2", State: StateAlive}}}
	now := recv.Add(5 * time.Second)
	c, ok := r.Candidate(now, hashesFor("us-west-2", 1000)[:10], 10*64, nil)
	if !ok || c.RTTMs != 65 || c.SummaryAge != 5*time.Second || !c.Remote || c.Region != "us-west-2" {
		t.Fatalf("candidate %+v ok %v", c, ok)
	}
	// Sent 3s after it was built (as the sender reported), received 90s
	// of wall clock later by a receiver whose clock is 90s ahead: 3s old
	// on arrival, 7s old four seconds later. The build time is not read.
	late := r
	late.ReceivedAt, late.SentAge = s.BuiltAt.Add(90*time.Second), 3*time.Second
	if c, _ := late.Candidate(late.ReceivedAt.Add(4*time.Second), nil, 10, nil); c.SummaryAge != 7*time.Second {
		t.Fatalf("age from the sender's report: %v", c.SummaryAge)
	}
	// It is never negative (now before receipt, under a clock step).
	if c, _ := r.Candidate(recv.Add(-time.Second), nil, 10, nil); c.SummaryAge != 0 {
		t.Fatalf("age under skew: %v", c.SummaryAge)
	}
	// With a cost model, the candidate is priced at the region's soonest
	// pool (summary.Summary.Price), after its age and RTT are set.
	mixed := r
	var err error
	mixed.Summary, err = summary.Build(summary.Input{Region: "us-west-2", Generation: 2, BuiltAt: s.BuiltAt, BlockSize: 64,
		Load: []summary.ProfileLoad{{Profile: "b200", Pods: 2, PendingPrefillTokens: 2000}, {Profile: "h100", Pods: 6, PendingPrefillTokens: 6000}}},
		hashesFor("us-west-2", 100), summary.BuildConfig{MaxBytes: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	m, err := gorgo.New(gorgo.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := mixed.Candidate(now, nil, 20_000, nil)
	want := plain
	mixed.Summary.Price(&want, m)
	priced, _ := mixed.Candidate(now, nil, 20_000, m)
	if priced != want || priced.Profile != "b200" || priced.PendingPrefillTokens != 1000 || priced.SummaryAge != 5*time.Second || priced.RTTMs != 65 {
		t.Fatalf("priced candidate %+v, want %+v", priced, want)
	}
	if m.Estimate(&priced).TotalMs >= m.Estimate(&plain).TotalMs {
		t.Fatalf("the b200 pool is not priced below the region's mean at h100: %+v against %+v", priced, plain)
	}
	v := &RegionsView{Regions: []RegionView{r}, byName: map[string]int{"us-west-2": 0}}
	if got := v.Candidates(now, "", nil, 10, func(string) bool { return false }, nil, nil); len(got) != 0 {
		t.Fatal("a disallowed region became a candidate")
	}
	if got := v.Candidates(now, "", nil, 10, nil, nil, nil); len(got) != 1 || got[0].Suspect {
		t.Fatalf("the allowed region is missing or suspect: %+v", got)
	}
	// Models: a summary that lists models is a candidate only for those.
	withModels := r
	withModels.Summary = buildSummaryModels(t, "us-west-2", 2, 100, "m1")
	mv := &RegionsView{Regions: []RegionView{withModels}, byName: map[string]int{"us-west-2": 0}}
	if got := mv.Candidates(now, "m2", nil, 10, nil, nil, nil); len(got) != 0 {
		t.Fatal("a region that does not serve the model became a candidate")
	}
	if got := mv.Candidates(now, "m1", nil, 10, nil, nil, nil); len(got) != 1 {
		t.Fatal("the region serving the model is missing")
	}
	if serves, known := mv.Serves("m2"); serves || !known {
		t.Fatalf("Serves(m2) = %v, %v", serves, known)
	}
	if serves, _ := mv.Serves("m1"); !serves {
		t.Fatal("Serves(m1) = false")
	}
	if serves, known := v.Serves("anything"); !serves || !known {
		t.Fatalf("a summary without models serves every model: %v, %v", serves, known)
	}
	if serves, known := (&RegionsView{}).Serves("m1"); serves || known {
		t.Fatalf("no summaries: %v, %v", serves, known)
	}
	// Its controllers stop answering pings (suspect, not dead): still a
	// candidate, marked Suspect, for traffic with nowhere else to go.
	sus := r
	sus.Live, sus.Alive, sus.Suspect = false, 0, 1
	if c, ok := sus.Candidate(now, nil, 10, nil); !ok || !c.Suspect {
		t.Fatalf("suspect region: %+v ok %v", c, ok)
	}
	// Every controller declared dead by this node's failure detector:
	// still a Suspect candidate (the region's state is the Raft tier's to
	// say), for traffic with nowhere else to go.
	dead := sus
	dead.Suspect, dead.Dead = 0, 1
	dead.Controllers = []Controller{{Name: "ctl-us-west-2", State: StateDead}}
	if c, ok := dead.Candidate(now, nil, 10, nil); !ok || !c.Suspect {
		t.Fatalf("a region whose controllers are declared dead: %+v ok %v", c, ok)
	}
	// No controller known at all: no candidate.
	gone := dead
	gone.Dead, gone.Controllers = 0, nil
	if _, ok := gone.Candidate(now, nil, 10, nil); ok {
		t.Fatal("a region with no controller became a candidate")
	}
}

// TestPublishErrors: wrong region, stale generation, oversize.
func TestPublishErrors(t *testing.T) {
	cfg := testConfig(t, "a", "us-east-1", newKey(t))
	cfg.MaxSummaryBytes = 2 << 10
	n := open(t, cfg)
	if err := n.Publish(buildSummary(t, "us-west-2", 1, 10)); !errors.Is(err, ErrWrongRegion) {
		t.Errorf("wrong region: %v", err)
	}
	if err := n.Publish(buildSummary(t, "us-east-1", 5, 10)); err != nil {
		t.Fatal(err)
	}
	if err := n.Publish(buildSummary(t, "us-east-1", 5, 20)); !errors.Is(err, ErrStaleGeneration) {
		t.Errorf("same generation: %v", err)
	}
	if err := n.Publish(buildSummary(t, "us-east-1", 6, 5000)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversize: %v", err)
	}
}

// TestSummaryAgeSkewAndGenerations: a summary's age is the sender's
// reported age plus the time since receipt, whichever of the body and its
// age message arrives first, with no remote wall clock read; the sender's
// clock skew is measured from the age message; a summary of an older
// generation is rejected and counted until the one held is
// OlderGenerationAfter old, then taken (its region restarted).
func TestSummaryAgeSkewAndGenerations(t *testing.T) {
	now := time.Now()
	cfg := testConfig(t, "a", "us-east-1", newKey(t))
	n := bareNode(t, cfg, &now)
	n.mu.Lock()
	addPeer(n, "w1", "us-west-2", 60*time.Millisecond, 60*time.Millisecond, 60*time.Millisecond)
	n.mu.Unlock()
	body := func(gen uint64) []byte {
		b, err := buildSummary(t, "us-west-2", gen, 100).MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	age := func(gen uint64, b []byte, a time.Duration) {
		m := ageMsg{From: "w1", Region: "us-west-2", Generation: gen, Hash: bodyHash(b), Age: a,
			SentAt: now.Add(90*time.Second - 30*time.Millisecond).UnixNano()} // its clock is 90s ahead
		(*delegate)(n).NotifyMsg(m.encode())
	}
	view := func() *RegionView {
		r, ok := n.View().Region("us-west-2")
		if !ok || r.Summary == nil {
			t.Fatal("no summary of us-west-2")
		}
		return r
	}

	b5 := body(5)
	age(5, b5, 3*time.Second) // the age message first
	if err := n.receive(b5, "pull"); err != nil {
		t.Fatal(err)
	}
	if got := view().Age(now); got != 3*time.Second {
		t.Fatalf("age on receipt %v, want the reported 3s", got)
	}
	if r := view(); !r.SkewKnown || r.ClockSkew != 90*time.Second {
		t.Fatalf("skew %v (known %v), want 90s", r.ClockSkew, r.SkewKnown)
	}
	now = now.Add(4 * time.Second)
	if got := view().Age(now); got != 7*time.Second {
		t.Fatalf("age 4s later %v, want 7s", got)
	}

	b6 := body(6)
	if err := n.receive(b6, "pull"); err != nil { // the body first
		t.Fatal(err)
	}
	age(6, b6, time.Second)
	if r := view(); r.Summary.Generation != 6 || r.Age(now) != time.Second {
		t.Fatalf("generation %d age %v, want 6 and 1s", r.Summary.Generation, r.Age(now))
	}

	older := counter(t, n.m.rejected.WithLabelValues("older_generation"))
	if err := n.receive(body(4), "push/pull"); err != nil {
		t.Fatal(err)
	}
	if r := view(); r.Summary.Generation != 6 || counter(t, n.m.rejected.WithLabelValues("older_generation")) != older+1 {
		t.Fatalf("an older generation was taken (held %d) or not counted", r.Summary.Generation)
	}
	now = now.Add(cfg.OlderGenerationAfter)
	if err := n.receive(body(4), "push/pull"); err != nil {
		t.Fatal(err)
	}
	if r := view(); r.Summary.Generation != 4 {
		t.Fatalf("held generation %d: the restarted region's summary was not taken once the held one was old", r.Summary.Generation)
	}
}
