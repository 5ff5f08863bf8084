package enginesim

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/regional/kvevents"
)

// TestEngineKinds: with Engine set, the simulator's KV events take that
// engine's wire form (decoded back through regional/kvevents) and its
// /metrics that engine's names; the cache and the API are the same.
func TestEngineKinds(t *testing.T) {
	prompt := `{"model":"meridian/sim-70b","prompt":[` + strings.Repeat("7,", 40) + `8],"max_tokens":1,"cache_salt":"tenant-a"}`
	for _, c := range []struct {
		engine  string
		check   func(t *testing.T, s *kvevents.BlockStored)
		metrics []string
	}{
		{kvevents.EngineVLLM, func(t *testing.T, s *kvevents.BlockStored) {
			if s.CacheSalt.Valid || len(s.ExtraKeys) == 0 || string(s.ExtraKeys[0]) != string(kvevents.RawStrings([]string{"tenant-a"})) {
				t.Fatalf("vllm: the salt is block 0's extra key: %+v", s)
			}
		}, []string{"vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prefix_cache_hits_total"}},
		{kvevents.EngineSGLang, func(t *testing.T, s *kvevents.BlockStored) {
			if s.CacheSalt != kvevents.Some("tenant-a") || s.ExtraKeys != nil || s.LoRAName.Valid {
				t.Fatalf("sglang: the salt is the event's cache_salt: %+v", s)
			}
		}, []string{"sglang:token_usage", "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:cached_tokens_total"}},
		{kvevents.EngineTRTLLM, func(t *testing.T, s *kvevents.BlockStored) {
			if s.CacheSalt.Valid || s.ExtraKeys != nil {
				t.Fatalf("trtllm: its events carry no salt: %+v", s)
			}
		}, []string{"trtllm_kv_cache_utilization", "trtllm_num_requests_running", "trtllm_num_requests_waiting"}},
	} {
		t.Run(c.engine, func(t *testing.T) {
			cfg := fastConfig()
			cfg.Engine = c.engine
			te := openTestEngine(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if status, b := te.post(ctx, "/v1/completions", prompt); status != http.StatusOK {
				t.Fatalf("status %d: %s", status, b)
			}
			if err := te.pub.WaitFor(ctx, func(evs []Event) bool {
				for _, ev := range evs {
					if ev.Kind == BlockStored {
						return true
					}
				}
				return false
			}); err != nil {
				t.Fatal(err)
			}
			d, _ := kvevents.NewDecoder(kvevents.DefaultDecoderConfig())
			var stored *kvevents.BlockStored
			var up *kvevents.PodUp
			for _, b := range te.pub.Batches() {
				if b.Engine != c.engine {
					t.Fatalf("batch engine %q", b.Engine)
				}
				kb := b.KVBatch()
				msg, err := EncodingFor(c.engine).AppendBatch(nil, &kb)
				if err != nil {
					t.Fatal(err)
				}
				got, err := d.Decode(msg)
				if err != nil {
					t.Fatal(err)
				}
				for _, ev := range got.Events {
					switch ev := ev.(type) {
					case *kvevents.BlockStored:
						s := *ev
						stored = &s
					case *kvevents.PodUp:
						u := *ev
						up = &u
					}
				}
			}
			if stored == nil || up == nil || up.Engine != c.engine || up.KVBlocks != uint64(te.Config().CacheBlocks) {
				t.Fatalf("stored %+v, pod up %+v", stored, up)
			}
			c.check(t, stored)
			_, body := te.get("/metrics")
			for _, name := range c.metrics {
				if !strings.Contains(string(body), "\n"+name+"{") {
					t.Errorf("/metrics lacks %s", name)
				}
			}
			for _, other := range []string{"vllm:", "sglang:", "trtllm_"} {
				if !strings.HasPrefix(c.metrics[0], other) && strings.Contains(string(body), "\n"+other) {
					t.Errorf("/metrics of a %s pod has %s series", c.engine, other)
				}
			}
		})
	}
	if err := (Config{Engine: "tgi"}).Validate(); err == nil || !strings.Contains(err.Error(), `Engine "tgi"`) {
		t.Fatalf("unknown engine: %v", err)
	}
	if got := fmt.Sprint(EncodingFor(kvevents.EngineSGLang)); got != fmt.Sprint(kvevents.Encoding{Events: kvevents.EventsMap, Hashes: kvevents.HashInt}) {
		t.Fatalf("sglang encoding %s", got)
	}
}
