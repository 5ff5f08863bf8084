package kvevents

import (
	"testing"
	"time"
)

// Every field takes part in the MAC, and no two announcements that differ
// share one (length prefixes: "ab"+"c" is not "a"+"bc").
func TestAnnounceMAC(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	u := PodUp{Pod: "pod-1", Endpoint: "http://10.0.0.7:8000", Model: "m", Hardware: "h100", Region: "us-east-1", Epoch: 7}
	mac := AnnounceMAC(key, &u)
	if !AnnounceMACValid(key, &u, mac) {
		t.Fatal("own MAC does not verify")
	}
	for name, mut := range map[string]func(*PodUp){
		"pod":       func(p *PodUp) { p.Pod = "pod-2" },
		"endpoint":  func(p *PodUp) { p.Endpoint = "http://evil:8000" },
		"model":     func(p *PodUp) { p.Model = "n" },
		"hardware":  func(p *PodUp) { p.Hardware = "b200" },
		"region":    func(p *PodUp) { p.Region = "eu-west-1" },
		"epoch":     func(p *PodUp) { p.Epoch = 8 },
		"shift":     func(p *PodUp) { p.Pod, p.Endpoint = "pod-1http://10.0.0.7", ":8000" },
		"engine":    func(p *PodUp) { p.Engine = "sglang" },
		"kv_blocks": func(p *PodUp) { p.KVBlocks = 1 << 20 },
		"ttl":       func(p *PodUp) { p.TTL = time.Minute },
	} {
		v := u
		mut(&v)
		if AnnounceMACValid(key, &v, mac) {
			t.Errorf("%s changed, MAC still valid", name)
		}
	}
	// An announcement with an engine and a capacity covers them too.
	w := u
	w.Engine, w.KVBlocks = "trtllm", 4096
	wmac := AnnounceMAC(key, &w)
	if wmac == mac || !AnnounceMACValid(key, &w, wmac) {
		t.Fatal("engine and kv_blocks not in the MAC")
	}
	w.KVBlocks = 8192
	if AnnounceMACValid(key, &w, wmac) {
		t.Error("kv_blocks changed, MAC still valid")
	}
	if AnnounceMACValid([]byte("another key of thirty-two bytes!"), &u, mac) {
		t.Error("MAC valid under another key")
	}
}
