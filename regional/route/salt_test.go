package route

import "testing"

// TestDecideSaltedAvoidsSaltBlindPods: a salted request goes to a pod whose
// events carry salts, even when a TensorRT-LLM pod holds more of its
// prefix (it would index the salted blocks as unsalted); an unsalted one
// may go anywhere; with only salt-blind pods left, one of them serves.
func TestDecideSaltedAvoidsSaltBlindPods(t *testing.T) {
	f := newFixture(t, 2, nil)
	trt := f.pod(t, "pod-0")
	info := trt.Info()
	info.Engine = "trtllm"
	if _, _, err := f.reg.Upsert(info); err != nil {
		t.Fatal(err)
	}
	c := chain(7, 8)
	if err := f.idx.Register(trt.ID, 0, c); err != nil {
		t.Fatal(err)
	}
	r := req(c)
	r.Salted = true
	d, err := f.dec.Decide(r)
	if err != nil || d.PodName != "pod-1" || d.Filtered["salt_blind"] != 1 {
		t.Fatalf("salted: %+v %v", d, err)
	}
	if d, err := f.dec.Decide(req(c)); err != nil || d.PodName != "pod-0" {
		t.Fatalf("unsalted: %+v %v", d, err)
	}
	r.Exclude = []*Pod{f.pod(t, "pod-1")}
	if d, err := f.dec.Decide(r); err != nil || d.PodName != "pod-0" {
		t.Fatalf("only salt-blind pods left: %+v %v", d, err)
	}
}
