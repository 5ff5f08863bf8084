package route

import (
	"fmt"
	"testing"
	"time"
)

// exchange delivers each table's queued pins to the other, both rounds
// taken before either is applied, as two replicas' reports cross.
func exchange(a, b *Sessions, now time.Time) {
	pa, _ := a.TakePins(nil)
	pb, _ := b.TakePins(nil)
	for _, p := range pa {
		b.NotePeer(p, now)
	}
	for _, p := range pb {
		a.NotePeer(p, now)
	}
}

func sharing() *Sessions {
	s := NewSessions(time.Hour, 100)
	s.ShareWithPeers(100)
	return s
}

// Two replicas that pin a session at once to different pods settle on
// one pod after one exchange, whichever pinned first and whether or not
// their clocks tell the two apart; they do not each take the other's.
func TestSessionsConcurrentPinsConverge(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name   string
		ta, tb time.Time
		want   string
	}{
		{"a later", t0.Add(time.Millisecond), t0, "pod-a"},
		{"b later", t0, t0.Add(time.Millisecond), "pod-b"},
		{"same instant", t0, t0, "pod-a"}, // the lower pod name
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := sharing(), sharing()
			a.Note("s", "pod-a", tc.ta)
			b.Note("s", "pod-b", tc.tb)
			exchange(a, b, t0.Add(time.Second))
			pa, _, _ := a.Pinned("s", t0.Add(time.Second))
			pb, _, _ := b.Pinned("s", t0.Add(time.Second))
			if pa != tc.want || pb != tc.want {
				t.Errorf("after the exchange a pins %q, b %q; want both %q", pa, pb, tc.want)
			}
			// Nothing new is queued: the exchange ends there.
			if pins, _ := a.TakePins(nil); len(pins) != 0 {
				t.Errorf("a queued %v after taking b's pin", pins)
			}
		})
	}
}

// A pin that arrives after a newer one (its report delayed or reordered)
// does not move the session back; the next placement moves it on, even
// when this replica's clock is behind the stamp it replaces.
func TestSessionsStalePinIgnored(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a, b := sharing(), sharing()
	a.Note("s", "pod-1", t0)
	old, _ := a.TakePins(nil)
	a.Note("s", "pod-2", t0.Add(time.Second))
	newer, _ := a.TakePins(nil)
	b.NotePeer(newer[0], t0.Add(2*time.Second))
	b.NotePeer(old[0], t0.Add(2*time.Second))
	if p, _, _ := b.Pinned("s", t0.Add(2*time.Second)); p != "pod-2" {
		t.Fatalf("after a late older pin b pins %q, want pod-2", p)
	}
	// b's clock lags a's: its placement still comes after the pin it saw.
	b.Note("s", "pod-3", t0)
	exchange(a, b, t0.Add(3*time.Second))
	for name, s := range map[string]*Sessions{"a": a, "b": b} {
		if p, _, _ := s.Pinned("s", t0.Add(3*time.Second)); p != "pod-3" {
			t.Errorf("%s pins %q, want b's later placement pod-3", name, p)
		}
	}
}

// An unstamped pin (a replica of an older version) is taken as the latest,
// as before stamps; a pin does not move a session with requests in flight
// here on another pod, whatever its stamp.
func TestSessionsUnstampedAndBusyPins(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := sharing()
	s.Note("s", "pod-1", t0.Add(time.Hour))
	s.NotePeer(Pin{Key: SessionKey("s"), Pod: "pod-2"}, t0)
	if p, _, _ := s.Pinned("s", t0); p != "pod-2" {
		t.Errorf("after an unstamped pin: %q, want pod-2", p)
	}
	s.TakePins(nil)
	s.Begin("busy", "pod-1", t0)
	s.TakePins(nil)
	later := t0.Add(time.Hour).UnixNano()
	s.NotePeer(Pin{Key: SessionKey("busy"), Pod: "pod-2", Stamp: later}, t0)
	if p, n, _ := s.Pinned("busy", t0); p != "pod-1" || n != 1 {
		t.Errorf("a busy session after a later pin: %q with %d in flight, want pod-1 with 1", p, n)
	}
	// The peer is told the pod of the requests in flight, stamped after
	// its own pin, so that both end on it.
	if pins, _ := s.TakePins(nil); len(pins) != 1 || pins[0].Pod != "pod-1" || pins[0].Stamp <= later {
		t.Errorf("after refusing a later pin for requests in flight, queued %+v", pins)
	}
	// A pin of a session not known here creates it.
	for i := range 3 {
		s.NotePeer(Pin{Key: SessionKey(fmt.Sprint(i)), Pod: "pod-9", Stamp: t0.UnixNano()}, t0)
		if p, n, ok := s.Pinned(fmt.Sprint(i), t0); p != "pod-9" || n != 0 || !ok {
			t.Errorf("session %d: %q, %d, %v", i, p, n, ok)
		}
	}
}
