package sim

import (
	"bytes"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
)

// WriteCharts writes a sweep's charts into dir: ttft_p95_vs_load.svg (with
// the 95% intervals), hit_rate_vs_load.svg, utilization_vs_load.svg,
// cross_region_vs_load.svg, egress_vs_load.svg, residency.svg, ablation.svg
// (when the sweep ran ablations) and report.json with every figure.
func (r *SweepReport) WriteCharts(dir string) error {
	return writeSVGFiles(dir, append(r.charts(), namedWriter{"report.json", func(w io.Writer) error { return writeIndentedJSON(w, r) }}))
}

// mainPolicies are the sweep's policies but Meridian's ablations.
func (r *SweepReport) mainPolicies() []string {
	var out []string
	for _, p := range r.Policies {
		if !slices.Contains(AblationNames(), p) {
			out = append(out, p)
		}
	}
	return out
}

// styleFor is a policy's style: by its place among all policies, so it
// is the same in every chart and every report.
func styleFor(policy string) seriesStyle {
	all := append(PolicyNames(), AblationNames()...)
	return styleOf(max(slices.Index(all, policy), 0))
}

func (r *SweepReport) lines(value func(SweepRun) float64, interval bool) []line {
	var out []line
	for _, p := range r.mainPolicies() {
		l := line{name: p, style: styleFor(p)}
		for _, load := range r.Loads {
			x, ok := r.Run(load, p)
			if !ok {
				continue
			}
			l.x = append(l.x, load)
			l.y = append(l.y, value(x))
			if interval {
				l.lo = append(l.lo, x.TTFTP95CI95Ms[0])
				l.hi = append(l.hi, x.TTFTP95CI95Ms[1])
			}
		}
		out = append(out, l)
	}
	return out
}

// crossShare is the mean over seeds of the share of requests served
// outside their origin region, for policy p at load index li.
func (r *SweepReport) crossShare(li int, p string) float64 {
	pi := slices.Index(r.Policies, p)
	s := 0.0
	for _, seed := range r.Results[li] {
		s += share(seed[pi].CrossRegionRequests, seed[pi].Requests)
	}
	return s / float64(len(r.Results[li]))
}

func (r *SweepReport) charts() []namedWriter {
	title := func(s string) string { return fmt.Sprintf("%s (%s, %s)", s, r.Workload, plural(r.Seeds, "seed")) }
	out := []namedWriter{
		{"ttft_p95_vs_load.svg", func(w io.Writer) error {
			return writeLines(w, title("TTFT p95 vs load, mean and 95% CI"), "offered prefill load", "TTFT p95 (log scale)", true, msTick,
				r.lines(func(x SweepRun) float64 { return x.TTFTP95Ms }, true))
		}},
		{"hit_rate_vs_load.svg", func(w io.Writer) error {
			return writeLines(w, title("Prefix hit rate vs load"), "offered prefill load", "hit rate (blocks)", false, pctTick,
				r.lines(func(x SweepRun) float64 { return 100 * x.HitRate }, false))
		}},
		{"utilization_vs_load.svg", func(w io.Writer) error {
			return writeLines(w, title("Achieved prefill utilisation vs offered load"), "offered prefill load", "achieved prefill utilisation", false, numTick,
				r.lines(func(x SweepRun) float64 { return x.Utilization }, false))
		}},
		{"cross_region_vs_load.svg", func(w io.Writer) error {
			var ls []line
			for _, p := range r.mainPolicies() {
				l := line{name: p, style: styleFor(p)}
				for li, load := range r.Loads {
					l.x = append(l.x, load)
					l.y = append(l.y, 100*r.crossShare(li, p))
				}
				ls = append(ls, l)
			}
			return writeLines(w, title("Requests served outside their origin region"), "offered prefill load", "% of requests", false, numTick, ls)
		}},
		{"egress_vs_load.svg", func(w io.Writer) error {
			return writeLines(w, title("Cross-region egress per run"), "offered prefill load", "egress (MB)", false, numTick,
				r.lines(func(x SweepRun) float64 { return 1000 * x.EgressGB }, false))
		}},
		{"residency.svg", func(w io.Writer) error {
			var g []barGroup
			for _, p := range r.Policies {
				n := 0
				for _, load := range r.Loads {
					x, _ := r.Run(load, p)
					n += x.ResidencyViolations
				}
				st := styleFor(p)
				g = append(g, barGroup{label: p, values: []float64{float64(n)}, style: &st})
			}
			return writeBars(w, title("Residency violations, all loads and seeds"), "policy", "violations", false, numTick,
				[]string{""}, []seriesStyle{{color: "#c44e52"}}, g)
		}},
	}
	if abl := r.ablationSeries(); len(abl) > 1 {
		out = append(out, namedWriter{"ablation.svg", func(w io.Writer) error {
			var styles []seriesStyle
			var names []string
			for _, p := range abl {
				styles = append(styles, styleFor(p))
				name := p
				if p == PolicyCacheLocal {
					name = "cache_local (no global)"
				}
				names = append(names, name)
			}
			var g []barGroup
			for _, load := range r.Loads {
				grp := barGroup{label: fmt.Sprintf("load %.2g", load)}
				for _, p := range abl {
					x, _ := r.Run(load, p)
					grp.values = append(grp.values, x.TTFTP95Ms)
				}
				g = append(g, grp)
			}
			return writeBars(w, title("Ablations: Meridian's TTFT p95 with one part off"), "offered prefill load", "TTFT p95 (log scale)", true, msTick, names, styles, g)
		}})
	}
	return out
}

// ablationSeries is meridian, the ablations the sweep ran and cache_local
// (cross-region placement off), in that order.
func (r *SweepReport) ablationSeries() []string {
	var out []string
	for _, p := range append(append([]string{PolicyMeridian}, AblationNames()...), PolicyCacheLocal) {
		if slices.Contains(r.Policies, p) {
			out = append(out, p)
		}
	}
	if len(out) == 2 && out[1] == PolicyCacheLocal {
		return nil // no ablation ran
	}
	return out
}

// Comparison is Meridian against the best of a set of baselines at one
// load: the ratio of their mean TTFT p95s.
type Comparison struct {
	Load     float64 `json:"load"`
	Baseline string  `json:"baseline"`
	Ratio    float64 `json:"ratio"` // meridian / baseline
}

// Against compares policy with the best (lowest mean TTFT p95) of the
// baselines the sweep ran, at every load.
func (r *SweepReport) Against(policy string, baselines []string) []Comparison {
	var out []Comparison
	for _, load := range r.Loads {
		m, ok := r.Run(load, policy)
		if !ok {
			continue
		}
		best := ""
		bestP95 := math.Inf(1)
		for _, b := range baselines {
			if x, ok := r.Run(load, b); ok && x.TTFTP95Ms < bestP95 {
				best, bestP95 = b, x.TTFTP95Ms
			}
		}
		if best != "" {
			out = append(out, Comparison{Load: load, Baseline: best, Ratio: m.TTFTP95Ms / bestP95})
		}
	}
	return out
}

// WriteHTML writes the sweep as one self-contained HTML page: the run's
// parameters, Meridian against the best fair and peer baselines and
// against cache_local at each load, every chart inline, and every row.
func (r *SweepReport) WriteHTML(w io.Writer) error {
	var b bytes.Buffer
	pageOpen(&b, fmt.Sprintf("meridian sim: %s, %s x %s x %s", r.Workload, plural(len(r.Loads), "load"), plural(len(r.Policies), "policy"), plural(r.Seeds, "seed")))
	paramsTable(&b, r.Params)
	if slices.Contains(r.Policies, PolicyMeridian) {
		b.WriteString("<h2>Meridian against the baselines (ratio of mean TTFT p95)</h2>\n<table><tr><th>load</th><th>achieved (meridian)</th>")
		b.WriteString("<th>best fair baseline</th><th>meridian / it</th><th>best peer baseline</th><th>meridian / it</th><th>meridian / cache_local</th></tr>\n")
		fair, peer := r.Against(PolicyMeridian, FairBaselines()), r.Against(PolicyMeridian, PeerBaselines())
		local := r.Against(PolicyMeridian, []string{PolicyCacheLocal})
		for i, load := range r.Loads {
			m, _ := r.Run(load, PolicyMeridian)
			fmt.Fprintf(&b, "<tr><td>%.2f</td><td>%.2f</td>%s%s%s</tr>\n", load, m.Utilization, cmpCells(fair, i, true), cmpCells(peer, i, true), cmpCells(local, i, false))
		}
		b.WriteString("</table>\n")
	}
	for _, c := range r.charts() {
		fmt.Fprintf(&b, "<h2>%s</h2>\n<figure>", html.EscapeString(strings.TrimSuffix(c.name, ".svg")))
		if err := c.write(&b); err != nil {
			return err
		}
		b.WriteString("</figure>\n")
	}
	b.WriteString("<h2>Every run (means over seeds)</h2>\n<table><tr><th>load</th><th>achieved</th><th>policy</th><th>hit</th><th>TTFT p50</th><th>p95</th><th>p95 95% CI</th><th>e2e p95</th><th>cross-region</th><th>egress GB</th><th>violations</th><th>dispersion</th></tr>\n")
	for _, x := range r.Runs {
		fmt.Fprintf(&b, "<tr><td>%.2f</td><td>%.2f</td><td>%s</td><td>%.1f%%</td><td>%s</td><td>%s</td><td>%s..%s</td><td>%s</td><td>%.1f</td><td>%.4f</td><td>%d</td><td>%.2f</td></tr>\n",
			x.Load, x.Utilization, html.EscapeString(x.Policy), 100*x.HitRate, ms(x.TTFTP50Ms), ms(x.TTFTP95Ms), ms(x.TTFTP95CI95Ms[0]), ms(x.TTFTP95CI95Ms[1]),
			ms(x.E2EP95Ms), x.CrossRegionRequests, x.EgressGB, x.ResidencyViolations, x.LoadDispersion)
	}
	b.WriteString("</table>\n</body></html>\n")
	_, err := w.Write(b.Bytes())
	return err
}

// plural is "1 seed", "5 seeds", "2 policies".
func plural(n int, word string) string {
	switch {
	case n == 1:
		return "1 " + word
	case strings.HasSuffix(word, "y"):
		return fmt.Sprintf("%d %sies", n, strings.TrimSuffix(word, "y"))
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func cmpCells(cs []Comparison, i int, named bool) string {
	if i >= len(cs) {
		return "<td></td><td></td>"
	}
	c := cs[i]
	cls := ""
	if c.Ratio > 1 {
		cls = ` class="worse"`
	}
	if !named {
		return fmt.Sprintf("<td%s>%.3f</td>", cls, c.Ratio)
	}
	return fmt.Sprintf("<td>%s</td><td%s>%.3f</td>", html.EscapeString(c.Baseline), cls, c.Ratio)
}

// WriteHTML writes one run as a self-contained HTML page: its parameters,
// its table and its charts.
func (r *Report) WriteHTML(w io.Writer, params map[string]string) error {
	var b bytes.Buffer
	pageOpen(&b, fmt.Sprintf("meridian sim: %s, seed %d", r.Workload, r.Seed))
	paramsTable(&b, params)
	b.WriteString("<h2>Results</h2>\n<pre>")
	var t bytes.Buffer
	if err := r.WriteTable(&t); err != nil {
		return err
	}
	b.WriteString(html.EscapeString(t.String()))
	b.WriteString("</pre>\n")
	for _, c := range r.charts() {
		fmt.Fprintf(&b, "<h2>%s</h2>\n<figure>", html.EscapeString(strings.TrimSuffix(c.name, ".svg")))
		if err := c.write(&b); err != nil {
			return err
		}
		b.WriteString("</figure>\n")
	}
	b.WriteString("</body></html>\n")
	_, err := w.Write(b.Bytes())
	return err
}

func pageOpen(b *bytes.Buffer, title string) {
	fmt.Fprintf(b, `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>%s</title>
<style>
body{font-family:sans-serif;max-width:1100px;margin:1em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
td.worse{background:#fde0dc}
figure{margin:0}
pre{font-size:12px;overflow-x:auto}
td.param{text-align:left;overflow-wrap:anywhere;font-family:monospace;font-size:12px}
svg{max-width:100%%;height:auto}
</style></head><body>
<h1>%s</h1>
`, html.EscapeString(title), html.EscapeString(title))
}

func paramsTable(b *bytes.Buffer, params map[string]string) {
	b.WriteString("<h2>Parameters</h2>\n<table>\n")
	for _, k := range sortedKeys(params) {
		fmt.Fprintf(b, "<tr><th>%s</th><td class=\"param\">%s</td></tr>\n", html.EscapeString(k), html.EscapeString(params[k]))
	}
	b.WriteString("</table>\n")
}
