package fleet

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meridian-llm/meridian/scenarios/sim"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}

func TestExamplePolicyMatchesDeploy(t *testing.T) {
	b, err := os.ReadFile("../../deploy/policies/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, ExamplePolicy) {
		t.Fatal("scenarios/fleet/policy.yaml differs from deploy/policies/example.yaml: copy it again")
	}
}

// The fleet's default round trips are the simulator's, for every pair.
func TestDefaultRTTIsTheSimulators(t *testing.T) {
	regions := sim.RegionNames(5)
	m, want := DefaultRTT(regions), sim.DefaultRTT(regions)
	if len(m) != len(regions)*(len(regions)-1)/2 {
		t.Fatalf("%d pairs for %d regions: %v", len(m), len(regions), m)
	}
	for i, a := range regions {
		for j, b := range regions {
			if i == j {
				continue
			}
			if got := m[key(a, b)]; got != want[i][j] || got == 0 {
				t.Errorf("%s<->%s: %v, the simulator's %v", a, b, got, want[i][j])
			}
		}
	}
	if got := m[key("us-east-1", "eu-west-1")]; got != 75*time.Millisecond {
		t.Errorf("us-east-1<->eu-west-1: %v", got)
	}
}

type chatResult struct {
	status int
	pod    string
	region string
	to     string
	body   string
}

func chat(t *testing.T, hc *http.Client, url string, hdr map[string]string, content string) chatResult {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "meridian/sim-70b", "max_tokens": 2,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return chatResult{resp.StatusCode, resp.Header.Get("X-Meridian-Pod"), resp.Header.Get("X-Meridian-Region"), resp.Header.Get("X-Meridian-Forwarded-To"), string(b)}
}
