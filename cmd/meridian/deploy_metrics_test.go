package main

// The metric half of the deploy checks (see deploy_test.go): the names the
// real components register, the names the alert rules, their promtool tests
// and the Grafana dashboard select, and the comparison of the two.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/global/globaltest"
	"github.com/meridian-llm/meridian/regional"
	"github.com/meridian-llm/meridian/regional/gossip"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

// ---------------------------------------------------------------------------
// Metrics: the names the components register.

// registeredMetrics knows the metric names the real components register.
// Gather lists only families with at least one series; a labelled vector
// that has not been used yet (requests by code, TTFT by pod) is absent from
// it although registered, so each registry is also asked directly: a probe
// descriptor with the name and a help text of its own cannot be registered
// where that name is taken.
type registeredMetrics struct {
	gathered map[string]dto.MetricType
	regs     []*prometheus.Registry
}

type probeCollector struct{ desc *prometheus.Desc }

func (p probeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- p.desc }
func (p probeCollector) Collect(chan<- prometheus.Metric)    {}

// registryHas reports whether name is registered on reg.
func registryHas(reg *prometheus.Registry, name string) bool {
	c := probeCollector{prometheus.NewDesc(name, "deploy_test probe of a metric name", nil, nil)}
	err := reg.Register(c)
	if err == nil {
		reg.Unregister(c)
		return false
	}
	// "a previously registered descriptor with the same fully-qualified
	// name ... has different label names or a different help string"; an
	// invalid name is an error of another kind.
	return strings.Contains(err.Error(), "fully-qualified name")
}

func (m *registeredMetrics) add(t *testing.T, reg *prometheus.Registry) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		m.gathered[mf.GetName()] = mf.GetType()
	}
	m.regs = append(m.regs, reg)
}

func (m *registeredMetrics) probe(name string) bool {
	for _, r := range m.regs {
		if registryHas(r, name) {
			return true
		}
	}
	return false
}

// known reports whether a series name used in PromQL exists: a registered
// name, or a histogram's _bucket/_sum/_count (a summary's _sum/_count). A
// histogram named bare is an error (classic histograms have no such series).
func (m *registeredMetrics) known(name string) error {
	if typ, ok := m.gathered[name]; ok {
		if typ == dto.MetricType_HISTOGRAM {
			return fmt.Errorf("%s is a histogram: use %s_bucket, _sum or _count", name, name)
		}
		return nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if typ, ok := m.gathered[base]; ok {
			if typ == dto.MetricType_HISTOGRAM || (typ == dto.MetricType_SUMMARY && suffix != "_bucket") {
				return nil
			}
			return fmt.Errorf("%s: %s is a %s, it has no %s series", name, base, typ, suffix)
		}
		if m.probe(base) {
			return nil // registered, no series yet, so of unknown type
		}
	}
	if m.probe(name) {
		return nil
	}
	return fmt.Errorf("%s is registered by no component", name)
}

// openComponentMetrics opens each component that exports metrics, as small
// as it goes, and returns what they register.
func openComponentMetrics(t *testing.T) *registeredMetrics {
	t.Helper()
	m := &registeredMetrics{gathered: map[string]dto.MetricType{}}
	discard := slog.New(slog.DiscardHandler)
	closeCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 10*time.Second)
	}

	// A regional controller on an in-process Kafka-protocol broker.
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	cfg := regional.DefaultConfig()
	cfg.Region, cfg.ControllerID, cfg.Listen = "deploy-test", "deploy-test-0", "127.0.0.1:0"
	cfg.Kafka.Brokers = broker.ListenAddrs()
	ctl, err := regional.Open(context.Background(), cfg, regional.Deps{Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := closeCtx()
		defer cancel()
		if err := ctl.Close(ctx); err != nil {
			t.Errorf("controller close: %v", err)
		}
	})
	m.add(t, ctl.Metrics)

	// A one-node Raft tier.
	greg := prometheus.NewRegistry()
	globaltest.NewCluster(t, 1, globaltest.Options{Configure: func(_ int, c *global.Config) { c.Registerer = greg }})
	m.add(t, greg)

	// An audit log.
	areg := prometheus.NewRegistry()
	acfg := audit.DefaultConfig()
	acfg.Dir, acfg.ControllerID, acfg.HMACKey = t.TempDir(), "deploy-test-0", bytes.Repeat([]byte{7}, 32)
	alog, err := audit.Open(acfg, audit.Deps{Registerer: areg, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := alog.Close(); err != nil {
			t.Errorf("audit close: %v", err)
		}
	})
	m.add(t, areg)

	// A gossip node alone in its pool.
	nreg := prometheus.NewRegistry()
	gcfg := gossip.DefaultConfig()
	gcfg.NodeName, gcfg.Region = "deploy-test-0", "deploy-test"
	gcfg.BindAddr, gcfg.BindPort = "127.0.0.1", 0
	gcfg.Keys = []string{base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{9}, 32))}
	gcfg.LeaveTimeout, gcfg.UpdateTimeout = 100*time.Millisecond, 100*time.Millisecond
	gcfg.Registerer, gcfg.Logger = nreg, discard
	ctx, cancel := closeCtx()
	node, err := gossip.Open(ctx, gcfg)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := node.Close(); err != nil {
			t.Errorf("gossip close: %v", err)
		}
	})
	m.add(t, nreg)

	// An engine simulator (the vllm: names it exports are vLLM's).
	ecfg := enginesim.DefaultConfig()
	ecfg.Name, ecfg.Logger = "deploy-test-pod", discard
	eng, err := enginesim.Open(ecfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := closeCtx()
		defer cancel()
		if err := eng.Close(ctx); err != nil {
			t.Errorf("engine close: %v", err)
		}
	})
	m.add(t, eng.Registry())
	return m
}

// ---------------------------------------------------------------------------
// PromQL: the metric names an expression selects.

var promqlAggregations = setOf("sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
	"bottomk", "topk", "quantile", "limitk", "limit_ratio")

var promqlFunctions = setOf("abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh",
	"avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh", "count_over_time",
	"day_of_month", "day_of_week", "day_of_year", "days_in_month", "deg", "delta", "deriv",
	"double_exponential_smoothing", "end", "exp", "floor", "histogram_avg", "histogram_count",
	"histogram_fraction", "histogram_quantile", "histogram_stddev", "histogram_stdvar", "histogram_sum",
	"holt_winters", "hour", "idelta", "increase", "info", "irate", "label_join", "label_replace",
	"last_over_time", "ln", "log10", "log2", "mad_over_time", "max_over_time", "min_over_time", "minute", "month",
	"pi", "predict_linear", "present_over_time", "quantile_over_time", "rad", "rate", "resets", "round", "scalar",
	"sgn", "sin", "sinh", "sort", "sort_by_label", "sort_by_label_desc", "sort_desc", "sqrt", "start",
	"stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp", "vector", "year")

// Keywords followed by a parenthesised list of label names.
var promqlLabelListKeywords = setOf("by", "without", "on", "ignoring", "group_left", "group_right")

var promqlKeywords = setOf("and", "or", "unless", "bool", "offset", "atan2", "inf", "nan")

func setOf(s ...string) map[string]bool {
	m := make(map[string]bool, len(s))
	for _, x := range s {
		m[x] = true
	}
	return m
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdentChar(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }

// skipBalanced returns the index after the bracket that closes s[i] (an
// opening bracket), skipping quoted strings.
func skipBalanced(s string, i int) (int, error) {
	open := s[i]
	close := map[byte]byte{'{': '}', '[': ']', '(': ')'}[open]
	depth := 0
	for j := i; j < len(s); j++ {
		switch c := s[j]; c {
		case '"', '\'', '`':
			end, err := skipString(s, j)
			if err != nil {
				return 0, err
			}
			j = end - 1
		case open:
			depth++
		case close:
			depth--
			if depth == 0 {
				return j + 1, nil
			}
		}
	}
	return 0, fmt.Errorf("unbalanced %q at offset %d", open, i)
}

// skipString returns the index after the string literal starting at s[i].
func skipString(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		if s[j] == '\\' && q != '`' {
			j++
			continue
		}
		if s[j] == q {
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at offset %d", i)
}

// promqlMetricNames returns the metric names an expression selects: every
// identifier that is not a function, aggregation or keyword, with label
// matchers ({...}), ranges ([...]), label lists (by (...)), strings,
// numbers, durations, comments and Grafana variables ($x, ${x}) skipped. An
// identifier called like a function that PromQL does not have is an error.
func promqlMetricNames(expr string) ([]string, error) {
	var names []string
	s := expr
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(s, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '{' || c == '[':
			end, err := skipBalanced(s, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '$':
			i++
			if i < len(s) && s[i] == '{' {
				end, err := skipBalanced(s, i)
				if err != nil {
					return nil, err
				}
				i = end
			}
			for i < len(s) && isIdentChar(s[i]) {
				i++
			}
		case c >= '0' && c <= '9' || (c == '.' && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9'):
			for i < len(s) && (isIdentChar(s[i]) || s[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdentChar(s[j]) {
				j++
			}
			id := s[i:j]
			k := j
			for k < len(s) && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n' || s[k] == '\r') {
				k++
			}
			calls := k < len(s) && s[k] == '('
			lower := strings.ToLower(id)
			switch {
			case promqlLabelListKeywords[lower]:
				if calls {
					end, err := skipBalanced(s, k)
					if err != nil {
						return nil, err
					}
					j = end
				}
			case promqlKeywords[lower], promqlAggregations[id]:
			case calls:
				if !promqlFunctions[id] {
					return nil, fmt.Errorf("%s( is no PromQL function", id)
				}
			default:
				names = append(names, id)
			}
			i = j
		default:
			i++
		}
	}
	return names, nil
}

// grafanaVariableMetrics returns the metrics a Grafana Prometheus template
// query selects: label_values(selector, label), query_result(expr); other
// forms (label_values(label), label_names(), metrics(re)) select none.
func grafanaVariableMetrics(q string) ([]string, error) {
	q = strings.TrimSpace(q)
	switch {
	case strings.HasPrefix(q, "label_values(") && strings.HasSuffix(q, ")"):
		inner := q[len("label_values(") : len(q)-1]
		depth, cut := 0, -1
		for i := 0; i < len(inner); i++ {
			switch inner[i] {
			case '{', '(', '[':
				depth++
			case '}', ')', ']':
				depth--
			case ',':
				if depth == 0 {
					cut = i
				}
			}
		}
		if cut < 0 {
			return nil, nil
		}
		return promqlMetricNames(inner[:cut])
	case strings.HasPrefix(q, "query_result(") && strings.HasSuffix(q, ")"):
		return promqlMetricNames(q[len("query_result(") : len(q)-1])
	case strings.HasPrefix(q, "label_names(") || strings.HasPrefix(q, "metrics("):
		return nil, nil
	}
	return promqlMetricNames(q)
}

// --- where assets name metrics ---

// metricUse is one metric name at one place in an asset, with the
// expression that selects it (empty for a promtool test's input series).
type metricUse struct{ where, name, expr string }

// ruleMetricUses returns the names selected by the rules' expressions, the
// names recording rules define, and structural problems.
func ruleMetricUses(path string, doc map[string]any) (uses []metricUse, recorded []string, problems []string) {
	for _, g := range asList(doc["groups"]) {
		gm := asMap(g)
		for i, r := range asList(gm["rules"]) {
			rm := asMap(r)
			alert, _ := rm["alert"].(string)
			record, _ := rm["record"].(string)
			where := fmt.Sprintf("%s: group %v rule %d %s%s", path, gm["name"], i, alert, record)
			expr, _ := rm["expr"].(string)
			if (alert == "") == (record == "") || strings.TrimSpace(expr) == "" {
				problems = append(problems, where+": want exactly one of alert and record, and an expr")
				continue
			}
			if record != "" {
				recorded = append(recorded, record)
			}
			if alert != "" {
				if asMap(rm["labels"])["severity"] == nil || asMap(rm["annotations"])["summary"] == nil {
					problems = append(problems, where+": an alert needs labels.severity and annotations.summary")
				}
				if f, ok := rm["for"].(string); ok {
					if _, err := time.ParseDuration(f); err != nil {
						problems = append(problems, fmt.Sprintf("%s: for %q: %v", where, f, err))
					}
				}
			}
			names, err := promqlMetricNames(expr)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", where, err))
			}
			for _, n := range names {
				uses = append(uses, metricUse{where, n, expr})
			}
		}
	}
	return uses, recorded, problems
}

// promtoolTestMetricUses returns the series names of promtool test inputs
// and the alert names the tests expect.
func promtoolTestMetricUses(path string, doc map[string]any) (uses []metricUse, alerts []string, problems []string) {
	for i, tc := range asList(doc["tests"]) {
		tm := asMap(tc)
		for _, s := range asList(tm["input_series"]) {
			series, _ := asMap(s)["series"].(string)
			names, err := promqlMetricNames(series)
			if err != nil || len(names) != 1 {
				problems = append(problems, fmt.Sprintf("%s: test %d: series %q: %v %v", path, i, series, names, err))
				continue
			}
			uses = append(uses, metricUse{fmt.Sprintf("%s: test %d input", path, i), names[0], ""})
		}
		for _, a := range asList(tm["alert_rule_test"]) {
			if name, ok := asMap(a)["alertname"].(string); ok {
				alerts = append(alerts, name)
			}
		}
	}
	return uses, alerts, problems
}

// dashboardMetricUses returns the names selected by every "expr" in a
// Grafana dashboard and by its template variables' queries.
func dashboardMetricUses(path string, b []byte) (uses []metricUse, problems []string) {
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		return nil, []string{fmt.Sprintf("%s: %v", path, err)}
	}
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if title, ok := v["title"].(string); ok {
				where = path + ": " + title
			}
			if expr, ok := v["expr"].(string); ok {
				names, err := promqlMetricNames(expr)
				if err != nil {
					problems = append(problems, fmt.Sprintf("%s: %v", where, err))
				}
				if len(names) == 0 && err == nil {
					problems = append(problems, fmt.Sprintf("%s: expr %q selects no metric", where, expr))
				}
				for _, n := range names {
					uses = append(uses, metricUse{where, n, expr})
				}
			}
			for _, x := range v {
				walk(where, x)
			}
		case []any:
			for _, x := range v {
				walk(where, x)
			}
		}
	}
	walk(path, dash["panels"])
	for _, v := range asList(asMap(dash["templating"])["list"]) {
		vm := asMap(v)
		if vm["type"] != "query" {
			continue
		}
		q, ok := vm["query"].(string)
		if !ok {
			q, _ = asMap(vm["query"])["query"].(string)
		}
		names, err := grafanaVariableMetrics(q)
		where := fmt.Sprintf("%s: variable %v", path, vm["name"])
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", where, err))
		}
		for _, n := range names {
			uses = append(uses, metricUse{where, n, q})
		}
	}
	return uses, problems
}

// Series that Prometheus itself makes for every target.
var prometheusSynthetic = setOf("up", "scrape_duration_seconds", "scrape_samples_scraped",
	"scrape_samples_post_metric_relabeling", "scrape_series_added", "ALERTS", "ALERTS_FOR_STATE")

// checkMetricUses returns a problem for each use of a name that no
// component registers (nor a recording rule defines).
func checkMetricUses(m *registeredMetrics, recorded []string, uses []metricUse) []string {
	var problems []string
	for _, u := range uses {
		if prometheusSynthetic[u.name] || slices.Contains(recorded, u.name) {
			continue
		}
		if err := m.known(u.name); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", u.where, err))
		}
	}
	return problems
}

// metricAssets gathers every metric use under root.
func metricAssets(t *testing.T, root string) (uses []metricUse, recorded, alertNames, expectedAlerts, problems []string) {
	t.Helper()
	for _, a := range loadDeployAssets(t, root) {
		switch a.kind {
		case kindPromRules:
			for _, d := range a.docs {
				u, r, p := ruleMetricUses(a.path, d)
				uses, recorded, problems = append(uses, u...), append(recorded, r...), append(problems, p...)
				for _, g := range asList(d["groups"]) {
					for _, r := range asList(asMap(g)["rules"]) {
						if name, ok := asMap(r)["alert"].(string); ok {
							alertNames = append(alertNames, name)
						}
					}
				}
			}
		case kindPromRuleTests:
			u, al, p := promtoolTestMetricUses(a.path, a.docs[0])
			uses, expectedAlerts, problems = append(uses, u...), append(expectedAlerts, al...), append(problems, p...)
		}
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".json" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var probe map[string]any
		if json.Unmarshal(b, &probe) == nil && probe["panels"] != nil {
			rel, _ := filepath.Rel(root, path)
			u, p := dashboardMetricUses(filepath.ToSlash(rel), b)
			uses, problems = append(uses, u...), append(problems, p...)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return uses, recorded, alertNames, expectedAlerts, problems
}

func TestDeployMetricsAreRegistered(t *testing.T) {
	uses, recorded, alertNames, expected, problems := metricAssets(t, deployRoot)
	for _, p := range problems {
		t.Error(p)
	}
	for _, a := range expected {
		if !slices.Contains(alertNames, a) {
			t.Errorf("promtool tests expect alert %s, which no rule defines", a)
		}
	}
	if len(uses) < 50 {
		t.Errorf("only %d metric uses found in rules and dashboards: is the extraction broken?", len(uses))
	}
	m := openComponentMetrics(t)
	for _, p := range checkMetricUses(m, recorded, uses) {
		t.Error(p)
	}
	distinct := map[string]bool{}
	for _, u := range uses {
		distinct[u.name] = true
	}
	t.Logf("%d uses of %d distinct metric names, %d families gathered from the components", len(uses), len(distinct), len(m.gathered))
}

// TestDeployPrometheusJobs: every job a rule selects by name is scraped by
// each scrape configuration.
func TestDeployPrometheusJobs(t *testing.T) {
	var jobsUsed []string
	var configs []deployAsset
	jobRe := regexp.MustCompile(`job\s*=\s*"([^"]+)"`)
	for _, a := range loadDeployAssets(t, deployRoot) {
		switch a.kind {
		case kindPromRules:
			for _, g := range asList(a.docs[0]["groups"]) {
				for _, r := range asList(asMap(g)["rules"]) {
					expr, _ := asMap(r)["expr"].(string)
					for _, m := range jobRe.FindAllStringSubmatch(expr, -1) {
						jobsUsed = append(jobsUsed, m[1])
					}
				}
			}
		case kindPromConfig:
			configs = append(configs, a)
		}
	}
	for _, c := range configs {
		var jobs []string
		for _, sc := range asList(c.docs[0]["scrape_configs"]) {
			jobs = append(jobs, fmt.Sprint(asMap(sc)["job_name"]))
		}
		for _, j := range jobsUsed {
			if !slices.Contains(jobs, j) {
				t.Errorf("%s: rules select job %q, which it does not scrape (jobs %v)", c.path, j, jobs)
			}
		}
	}
}

// ---------------------------------------------------------------------------
// The checks fail when they should.

func TestDeployPromQLExtraction(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
		err  bool
	}{
		{`up{job="meridian-controller"} == 0`, []string{"up"}, false},
		{`sum by (region, le) (rate(a_bucket{le="+Inf", x=~"a|b}"}[5m] offset 1h))`, []string{"a_bucket"}, false},
		{`histogram_quantile(0.99, sum by (le) (rate(x_seconds_bucket[$__rate_interval])))`, []string{"x_seconds_bucket"}, false},
		{"a / on (region) group_left (pod) b\n# comment naming c\n and bool c > 1e3", []string{"a", "b", "c"}, false},
		{`sum(rate(vllm:prefix_cache_hits_total{pod=~"$pod"}[${__range}])) / scalar(d)`, []string{"vllm:prefix_cache_hits_total", "d"}, false},
		{`count(count_values("version", m)) > 1 unless topk(3, n) or sum without (x) (o)`, []string{"m", "n", "o"}, false},
		{`max_over_time(p[1h:5m]) @ start()`, []string{"p"}, false},
		{`rat(q[5m])`, nil, true},
		{`sum(rate(r{a="unterminated}[5m]))`, nil, true},
	} {
		got, err := promqlMetricNames(tc.expr)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("promqlMetricNames(%q) = %v, %v; want %v (error %v)", tc.expr, got, err, tc.want, tc.err)
		}
	}
	for q, want := range map[string][]string{
		`label_values(meridian_ingest_connected{region=~"$region"}, instance)`: {"meridian_ingest_connected"},
		`label_values(region)`:       nil,
		`query_result(topk(5, z))`:   {"z"},
		`label_names()`:              nil,
		`label_values(a{b=",c"}, d)`: {"a"},
	} {
		got, err := grafanaVariableMetrics(q)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("grafanaVariableMetrics(%q) = %v, %v; want %v", q, got, err, want)
		}
	}
}

// TestDeployRegistryProbe: a labelled vector with no series yet is missed
// by Gather and found by the probe; an unregistered name is not found; the
// probe leaves the registry as it was.
func TestDeployRegistryProbe(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fixture_requests_total", Help: "h"}, []string{"code"}))
	reg.MustRegister(prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fixture_latency_seconds", Help: "h"}))
	m := &registeredMetrics{gathered: map[string]dto.MetricType{}}
	m.add(t, reg)
	if _, ok := m.gathered["fixture_requests_total"]; ok {
		t.Fatal("gather listed a vector without series; the probe is then not needed")
	}
	for name, ok := range map[string]bool{
		"fixture_requests_total":         true,
		"fixture_latency_seconds_bucket": true,
		"fixture_latency_seconds_count":  true,
		"fixture_latency_seconds":        false, // a histogram named bare
		"fixture_requests_total_bucket":  true,  // type unknown without series: accepted
		"fixture_made_up_total":          false,
	} {
		if err := m.known(name); (err == nil) != ok {
			t.Errorf("known(%s) = %v, want ok %v", name, err, ok)
		}
	}
	if registryHas(reg, "fixture_made_up_total") || !registryHas(reg, "fixture_requests_total") {
		t.Error("probe answers changed after probing")
	}
	mfs, _ := reg.Gather()
	if len(mfs) != 1 {
		t.Errorf("registry gathers %d families after probing, want 1", len(mfs))
	}
}

// TestDeployMetricChecksRejectMadeUp runs the metric checks on a fixture
// tree that names one metric no component registers.
func TestDeployMetricChecksRejectMadeUp(t *testing.T) {
	root := writeFixture(t, map[string]string{
		"prometheus/alerts.yaml": `groups:
  - name: g
    rules:
      - alert: Real
        expr: sum(rate(meridian_router_requests_total[5m])) > 0
        labels: {severity: warning}
        annotations: {summary: s}
      - alert: MadeUp
        expr: rate(meridian_made_up_metric_total[5m]) > 0
        labels: {severity: warning}
        annotations: {summary: s}
`,
		"grafana/d.json": `{"panels": [{"title": "p", "targets": [{"expr": "histogram_quantile(0.5, rate(meridian_made_up_seconds_bucket[5m]))"}]}]}`,
	})
	uses, recorded, _, _, problems := metricAssets(t, root)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_router_requests_total", Help: "h"}, []string{"code"}))
	m := &registeredMetrics{gathered: map[string]dto.MetricType{}}
	m.add(t, reg)
	got := strings.Join(checkMetricUses(m, recorded, uses), "\n")
	for _, want := range []string{"meridian_made_up_metric_total is registered by no component",
		"meridian_made_up_seconds_bucket is registered by no component"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems %q lack %q", got, want)
		}
	}
	if strings.Contains(got, "meridian_router_requests_total") {
		t.Errorf("a registered metric was reported: %s", got)
	}
}
