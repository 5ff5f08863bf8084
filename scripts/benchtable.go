//go:build ignore

// Command benchtable reads `go test -bench` output and prints the medians of
// the benchmarks behind Meridian's published targets as a small table, with
// each target and whether the run met it. Run: go run ./scripts/benchtable.go FILE
package main

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// samples[benchmark name][unit] = values across -count runs
type samples map[string]map[string][]float64

func parse(path string) (samples, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s := samples{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") {
			continue
		}
		name := fields[0]
		m := s[name]
		if m == nil {
			m = map[string][]float64{}
			s[name] = m
		}
		for i := 2; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				continue
			}
			m[fields[i+1]] = append(m[fields[i+1]], v)
		}
	}
	return s, sc.Err()
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	c := append([]float64(nil), v...)
	sort.Float64s(c)
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}

// find returns the samples of the benchmark named prefix, or else of the
// first one named prefix-N (names carry a -N GOMAXPROCS suffix when run with
// -cpu N>1).
func (s samples) find(prefix string) map[string][]float64 {
	var names []string
	for n := range s {
		if n == prefix || strings.HasPrefix(n, prefix+"-") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return nil
	}
	return s[names[0]]
}

type row struct {
	what, bench, unit string
	target            func(v float64) (string, bool)
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go run ./scripts/benchtable.go BENCH_OUTPUT")
		os.Exit(2)
	}
	s, err := parse(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
	naive := func() float64 {
		return median(s.find("BenchmarkNaiveLookup/pods=256/blocks=64/depths=4")["ns/op"])
	}
	atMost := func(limit float64, unit string) func(float64) (string, bool) {
		return func(v float64) (string, bool) { return fmt.Sprintf("<= %g %s", limit, unit), v <= limit }
	}
	atLeast := func(limit float64, unit string) func(float64) (string, bool) {
		return func(v float64) (string, bool) { return fmt.Sprintf(">= %g %s", limit, unit), v >= limit }
	}
	rows := []row{
		{"== index (issue 2)", "", "", nil},
		{"lookup 64 blocks, 256 pods, 4 depths", "BenchmarkLookup/pods=256/blocks=64/depths=4", "ns/op", atMost(1000, "ns")},
		{"  allocations", "BenchmarkLookup/pods=256/blocks=64/depths=4", "allocs/op", atMost(0, "allocs")},
		{"  speed-up over naive scan", "BenchmarkLookup/pods=256/blocks=64/depths=4", "ns/op", func(v float64) (string, bool) {
			n := naive()
			if v == 0 || n == 0 {
				return ">= 20x", false
			}
			return fmt.Sprintf(">= 20x (got %.1fx)", n/v), n/v >= 20
		}},
		{"naive lookup (baseline)", "BenchmarkNaiveLookup/pods=256/blocks=64/depths=4", "ns/op", nil},
		{"lookup 1024 blocks, 16 depths", "BenchmarkLookup/pods=256/blocks=1024/depths=16", "ns/op", atMost(10000, "ns")},
		{"registrations, presized, 1 cpu", "BenchmarkRegister/presized", "blocks/s", nil},
		{"registrations, presized, 2 cpus", "BenchmarkRegister/presized-2", "blocks/s", atLeast(10e6, "blocks/s")},
		{"registrations, growing, 1 cpu", "BenchmarkRegister/grow", "blocks/s", nil},
		{"registrations, growing, 2 cpus", "BenchmarkRegister/grow-2", "blocks/s", nil},
		{"memory at 1M blocks", "BenchmarkMemory/blocks=1M", "B/block", atMost(64, "B/block")},
		{"memory at 10M blocks", "BenchmarkMemory/blocks=10M", "B/block", atMost(64, "B/block")},
		{"== KV events (issue 3)", "", "", nil},
		{"decode+apply, 16->64 token blocks", "BenchmarkDecodeApply/ratio4", "blocks/s", atLeast(2e6, "blocks/s")},
		{"decode+apply, 2 goroutines", "BenchmarkDecodeApplyParallel-2", "blocks/s", atLeast(2e6, "blocks/s")},
		{"end to end through kfake", "BenchmarkIngestKafka", "events/s", atLeast(6e6, "events/s")},
		{"  per second of CPU (broker included)", "BenchmarkIngestKafka", "cpu-events/s", nil},
		{"  after the first message (steady)", "BenchmarkIngestKafka", "steady-events/s", nil},
		{"  start: group join, first fetch", "BenchmarkIngestKafka", "start-ms", nil},
		{"consumer alone (Apply), per CPU second", "BenchmarkIngestApply", "cpu-events/s", nil},
		{"== regional router (issue 4)", "", "", nil},
		{"decision, 256 pods, 16 depths: p50", "BenchmarkDecide/pods=256/blocks=128/depths=16", "p50-ns", atMost(50000, "ns")},
		{"  p99", "BenchmarkDecide/pods=256/blocks=128/depths=16", "p99-ns", atMost(200000, "ns")},
		{"decision, 128 depths (worst): p50", "BenchmarkDecide/pods=256/blocks=128/depths=128", "p50-ns", atMost(50000, "ns")},
		{"  p99", "BenchmarkDecide/pods=256/blocks=128/depths=128", "p99-ns", atMost(200000, "ns")},
		{"tokenize + decide, 8k-token prompt", "BenchmarkTokenizeAndDecide/tokens=8192", "ns/op", nil},
		{"20th turn, full re-tokenization", "BenchmarkSessionTokenization/full", "ns/op", nil},
		{"20th turn, from the session cache", "BenchmarkSessionTokenization/session", "ns/op", nil},
		{"proxy: added p99 at 1,000 req/s", "BenchmarkProxyOverhead/tls=off/stream=false", "added-p99-us", atMost(1000, "us")},
		{"  direct p99", "BenchmarkProxyOverhead/tls=off/stream=false", "direct-p99-us", nil},
		{"  proxied p99", "BenchmarkProxyOverhead/tls=off/stream=false", "proxy-p99-us", nil},
		{"proxy with TLS and API keys: added p99", "BenchmarkProxyOverhead/tls=on/stream=false", "added-p99-us", atMost(1000, "us")},
		{"  proxied p50 (TLS)", "BenchmarkProxyOverhead/tls=on/stream=false", "proxy-p50-us", nil},
		{"  proxied p99 (TLS)", "BenchmarkProxyOverhead/tls=on/stream=false", "proxy-p99-us", nil},
		{"shared prefix: TTFT p50, rr / Meridian", "BenchmarkE2ESharedPrefixTTFT", "p50-ratio", atLeast(3, "x")},
		{"  hit rate, Meridian / rr", "BenchmarkE2ESharedPrefixTTFT", "hit-ratio", atLeast(3, "x")},
		{"== speed toward the limit (issue 18)", "", "", nil},
		{"rotating lookup, 64 blocks, 4 depths", "BenchmarkLookupRotating/pods=256/blocks=64/depths=4", "ns/op", atMost(800, "ns")},
		{"  allocations", "BenchmarkLookupRotating/pods=256/blocks=64/depths=4", "allocs/op", atMost(0, "allocs")},
		{"  the same, hints cleared before each lookup", "BenchmarkLookupRotating/pods=256/blocks=64/depths=4/hints=off", "ns/op", nil},
		{"rotating lookup, 1024 blocks, 16 depths", "BenchmarkLookupRotating/pods=256/blocks=1024/depths=16", "ns/op", atMost(3000, "ns")},
		{"  the same, hints cleared before each lookup", "BenchmarkLookupRotating/pods=256/blocks=1024/depths=16/hints=off", "ns/op", nil},
		{"registration from empty, 1 cpu", "BenchmarkRegisterFromEmpty", "blocks/s", nil},
		{"registration from empty, 2 cpus", "BenchmarkRegisterFromEmpty-2", "blocks/s", atLeast(10e6, "blocks/s")},
		{"  per CPU-second of the process, 2 cpus", "BenchmarkRegisterFromEmpty-2", "cpu-blocks/s", nil},
		{"  page faults per 1k blocks, 2 cpus", "BenchmarkRegisterFromEmpty-2", "faults/kblock", nil},
		{"growth pause, incremental: start", "BenchmarkGrowthPause/growth=incremental", "growth-start-ns", nil},
		{"  steps, p99", "BenchmarkGrowthPause/growth=incremental", "growth-step-p99-ns", nil},
		{"growth pause, stop-the-world (old)", "BenchmarkGrowthPause/growth=stop-the-world", "growth-start-ns", nil},
		{"lookup under 2M writes/s: p50", "BenchmarkLookupUnderWrites-2", "p50-ns", nil},
		{"  p99", "BenchmarkLookupUnderWrites-2", "p99-ns", atMost(5000, "ns")},
		{"decision, 256 pods, 16 depths: p50", "BenchmarkDecide/pods=256/blocks=128/depths=16", "p50-ns", atMost(8000, "ns")},
		{"  p99", "BenchmarkDecide/pods=256/blocks=128/depths=16", "p99-ns", atMost(30000, "ns")},
		{"  machine floor p99 (same work each time, same run)", "BenchmarkDecide/pods=256/blocks=128/depths=16", "floor-p99-ns", nil},
		{"  allocations", "BenchmarkDecide/pods=256/blocks=128/depths=16", "allocs/op", atMost(0, "allocs")},
		{"placement, 10 remote regions: p50", "BenchmarkPlace/pods=256/remotes=10", "p50-ns", atMost(8000, "ns")},
		{"  p99", "BenchmarkPlace/pods=256/remotes=10", "p99-ns", atMost(30000, "ns")},
		{"  machine floor p99 (same work each time, same run)", "BenchmarkPlace/pods=256/remotes=10", "floor-p99-ns", nil},
		{"  allocations", "BenchmarkPlace/pods=256/remotes=10", "allocs/op", atMost(0, "allocs")},
		{"region backlog for the trend (every forwardable request), 256 pods", "BenchmarkBacklogMs", "ns/op", nil},
		{"tokenize + decide, 8k tokens, cold: p50", "BenchmarkTokenizeAndDecide/tokens=8192", "p50-ns", atMost(300000, "ns")},
		{"proxy, 2k-token chat, 1k req/s: added p50", "BenchmarkProxyOverhead/tls=off/stream=false", "added-p50-us", atMost(100, "us")},
		{"  added p99", "BenchmarkProxyOverhead/tls=off/stream=false", "added-p99-us", atMost(400, "us")},
		{"  streaming: added p50", "BenchmarkProxyOverhead/tls=off/stream=true", "added-p50-us", atMost(100, "us")},
		{"  streaming: added p99", "BenchmarkProxyOverhead/tls=off/stream=true", "added-p99-us", atMost(400, "us")},
		{"  TLS + API key: added p50", "BenchmarkProxyOverhead/tls=on/stream=false", "added-p50-us", nil},
		{"  TLS + API key: added p99", "BenchmarkProxyOverhead/tls=on/stream=false", "added-p99-us", nil},
		{"  TLS + API key, streaming: added p50", "BenchmarkProxyOverhead/tls=on/stream=true", "added-p50-us", nil},
		{"  TLS + API key, streaming: added p99", "BenchmarkProxyOverhead/tls=on/stream=true", "added-p99-us", nil},
		{"== global tier (issue 5)", "", "", nil},
		{"read state + routable + region state", "BenchmarkReadPath/StateRoutableRegionState", "ns/op", atMost(1000, "ns")},
		{"  allocations", "BenchmarkReadPath/StateRoutableRegionState", "allocs/op", atMost(0, "allocs")},
		{"residency evaluate (first rule)", "BenchmarkEvaluate/example/first-rule", "ns/op", nil},
		{"policy apply on the leader (3 nodes)", "BenchmarkPolicyApply/leader", "ns/op", nil},
		{"policy apply via a follower's admin API", "BenchmarkPolicyApply/admin-client-to-follower", "ns/op", nil},
		{"failover trigger -> all nodes: worst", "BenchmarkFailoverPropagation", "worst-propagation-ns", atMost(1e9, "ns")},
		{"== across regions (issue 6)", "", "", nil},
		{"summary build, 1M blocks", "BenchmarkBuild1M", "ns/op", nil},
		{"  summary bytes", "BenchmarkBuild1M", "bytes/summary", atMost(65536, "bytes")},
		{"remote depth estimate, 1562 blocks", "BenchmarkDepth/blocks=1562", "ns/op", nil},
		{"placement, 3 remote regions: p50", "BenchmarkPlace/pods=256/remotes=3", "p50-ns", atMost(100000, "ns")},
		{"placement, 10 remote regions: p50", "BenchmarkPlace/pods=256/remotes=10", "p50-ns", atMost(100000, "ns")},
		{"audit append, 256 appenders", "BenchmarkAppend/appenders=256", "records/s", atLeast(50000, "records/s")},
	}
	fmt.Printf("\n%-40s %14s  %-26s %s\n", "figure (median of runs)", "value", "target", "met")
	fmt.Println(strings.Repeat("-", 92))
	for _, r := range rows {
		if r.bench == "" {
			fmt.Println(r.what)
			continue
		}
		m := s.find(r.bench)
		v := median(m[r.unit])
		val := "missing"
		if len(m[r.unit]) > 0 {
			val = fmt.Sprintf("%.4g %s", v, r.unit)
		}
		tgt, met := "", ""
		if r.target != nil {
			var ok bool
			tgt, ok = r.target(v)
			met = "yes"
			if !ok || len(m[r.unit]) == 0 {
				met = "NO"
			}
		}
		fmt.Printf("%-40s %14s  %-26s %s\n", r.what, val, tgt, met)
	}
}
