package regional

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestDropReportingXargs: the keys that change what an engine reports are
// dropped from vllm_xargs, however spelt; everything else passes.
func TestDropReportingXargs(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"no xargs: untouched", `{"model":"m","prompt":"hi"}`, `{"model":"m","prompt":"hi"}`},
		{"other xargs: untouched", `{"model":"m", "vllm_xargs":{"kv_transfer_params":{"do_remote_prefill":true}}}`,
			`{"model":"m", "vllm_xargs":{"kv_transfer_params":{"do_remote_prefill":true}}}`},
		{"report mode dropped, the rest kept", `{"model":"m","vllm_xargs":{"kv_cache_report_mode":"full","my_ext":3}}`,
			`{"model":"m","vllm_xargs":{"my_ext":3}}`},
		{"report mode alone: vllm_xargs dropped", `{"model":"m","vllm_xargs":{"kv_cache_report_mode":"full"}}`, `{"model":"m"}`},
		{"escaped key names", `{"model":"m","vllm\u005fxargs":{"kv_cache_report\u005fmode":"full"}}`, `{"model":"m"}`},
		{"not json: untouched", `{"vllm_xargs":`, `{"vllm_xargs":`},
		{"xargs not an object: untouched", `{"vllm_xargs":"kv_cache_report_mode"}`, `{"vllm_xargs":"kv_cache_report_mode"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := string(dropReportingXargs([]byte(c.in)))
			if c.in == c.want {
				if got != c.want {
					t.Fatalf("changed: %s", got)
				}
				return
			}
			var g, w any
			if json.Unmarshal([]byte(got), &g) != nil || json.Unmarshal([]byte(c.want), &w) != nil {
				t.Fatalf("got %s", got)
			}
			gj, _ := json.Marshal(g)
			wj, _ := json.Marshal(w)
			if string(gj) != string(wj) || strings.Contains(got, "report") {
				t.Fatalf("got %s, want %s", got, c.want)
			}
		})
	}
}

// TestProxyDropsReportingXargs: the pod receives a client's request
// without the keys that would change its KV events, and with the rest.
func TestProxyDropsReportingXargs(t *testing.T) {
	got := make(chan []byte, 1)
	f := newServerFixture(t, []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- b
		okJSON(w, r)
	}}, nil)
	body := `{"model":"m","messages":[{"role":"user","content":"hello"}],"vllm_xargs":{"kv_cache_report_mode":"full","my_ext":"x"}}`
	if resp, b := post(t, f.url+"/v1/chat/completions", body); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	fwd := <-got
	var m struct {
		VLLMXargs map[string]any `json:"vllm_xargs"`
		Messages  []any          `json:"messages"`
	}
	if err := json.Unmarshal(fwd, &m); err != nil || len(m.Messages) != 1 || m.VLLMXargs["my_ext"] != "x" || m.VLLMXargs["kv_cache_report_mode"] != nil {
		t.Fatalf("forwarded %s", fwd)
	}
}
