package regional

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

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
		g := first.nextGeneration()
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
	if g := second.nextGeneration(); g <= last {
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
