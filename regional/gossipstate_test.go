package regional

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

var discard = slog.New(slog.DiscardHandler)

// TestGenerationsMonotoneAcrossRestarts: a controller's summary
// generations keep increasing across restarts, whatever its wall clock
// does, because the epoch that prefixes them is persisted and incremented
// at each start; the first epoch already exceeds wall-clock milliseconds
// (the generations earlier versions published), so peers still holding one
// of those take the new ones.
func TestGenerationsMonotoneAcrossRestarts(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ctl", "gossip-state.json")
	start := func() *multiRegion {
		st, err := nextEpoch(file)
		if err != nil {
			t.Fatal(err)
		}
		return &multiRegion{genEpoch: st.Epoch, gstate: st, gstateFile: file}
	}
	first := start()
	var last uint64
	for range 1000 {
		g := first.nextGeneration(discard)
		if g <= last {
			t.Fatalf("generation %d after %d", g, last)
		}
		last = g
	}
	const wallMillis2100 = 4102444800000
	if last < wallMillis2100 {
		t.Fatalf("generation %d is below wall-clock milliseconds of 2100", last)
	}
	second := start() // a restart (its clock may have stepped back a day: not read)
	if g := second.nextGeneration(discard); g <= last {
		t.Fatalf("first generation after a restart %d, not above the last before it %d", g, last)
	}

	// The peers remembered: most recent first, unique, bounded.
	st := second.gstate
	if !st.rememberPeers([]string{"10.0.0.2:7947", "10.0.0.3:7947"}) || st.rememberPeers([]string{"10.0.0.2:7947", "10.0.0.3:7947"}) {
		t.Fatal("rememberPeers reported the wrong change")
	}
	st.rememberPeers([]string{"10.0.0.4:7947", "10.0.0.2:7947"})
	if want := []string{"10.0.0.4:7947", "10.0.0.2:7947", "10.0.0.3:7947"}; !slices.Equal(st.Peers, want) {
		t.Fatalf("peers %v, want %v", st.Peers, want)
	}
	if err := st.save(file); err != nil {
		t.Fatal(err)
	}
	got, err := loadGossipState(file)
	if err != nil || got.Epoch != 2 || !slices.Equal(got.Peers, st.Peers) {
		t.Fatalf("state read back %+v, %v", got, err)
	}
	if err := os.WriteFile(file, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := nextEpoch(file); err == nil {
		t.Fatal("a corrupt state file was taken for a first start")
	}
}

// A replica that takes over publishing its region's summary continues
// above the generations the region's other replicas advertise (the other
// regions hold the highest they got), and keeps doing so after a restart:
// the epoch it moved to is persisted.
func TestGenerationsContinueAboveTheRegions(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ctl", "gossip-state.json")
	st, err := nextEpoch(file)
	if err != nil {
		t.Fatal(err)
	}
	peer := uint64(7)<<generationSeqBits | 12345 // another replica, at a later epoch
	mr := &multiRegion{genEpoch: st.Epoch, gstate: st, gstateFile: file, regionGen: func() uint64 { return peer }}
	g := mr.nextGeneration(discard)
	if g <= peer {
		t.Fatalf("generation %d not above the region's %d", g, peer)
	}
	if g2 := mr.nextGeneration(discard); g2 <= g {
		t.Fatalf("generation %d after %d", g2, g)
	}
	st, err = nextEpoch(file) // a restart
	if err != nil {
		t.Fatal(err)
	}
	restarted := &multiRegion{genEpoch: st.Epoch, gstate: st, gstateFile: file}
	if g3 := restarted.nextGeneration(discard); g3 <= g {
		t.Fatalf("after a restart: generation %d, not above %d", g3, g)
	}
}
