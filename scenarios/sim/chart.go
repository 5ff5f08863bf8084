package sim

import (
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// Charts are plain SVG, drawn here so the report needs nothing outside the
// binary. Every series has its own colour, dash pattern and marker (so a
// line hidden under another still shows its markers, and the charts read
// in black and white), and every chart has both axes with ticks and labels.

// seriesStyle is how one policy is drawn.
type seriesStyle struct {
	color, dash, marker string
}

var (
	chartColors = []string{"#d62728", "#ff7f0e", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
		"#7f7f7f", "#9467bd", "#aec7e8", "#2ca02c", "#1f77b4", "#000000", "#98df8a", "#c5b0d5", "#ff9896", "#c49c94"}
	chartDashes  = []string{"", "7,4", "2,3", "9,3,2,3", "4,2,1,2", "12,5"}
	chartMarkers = []string{"circle", "square", "triangle", "diamond", "cross", "plus", "down", "star"}
)

// styleOf is the style of the i-th policy of a report.
func styleOf(i int) seriesStyle {
	return seriesStyle{color: chartColors[i%len(chartColors)], dash: chartDashes[i%len(chartDashes)], marker: chartMarkers[i%len(chartMarkers)]}
}

// marker draws a marker of the style at (x, y).
func marker(w io.Writer, s seriesStyle, x, y float64) {
	const r = 4.0
	c := s.color
	switch s.marker {
	case "circle":
		fmt.Fprintf(w, `<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s"/>`, x, y, r, c)
	case "square":
		fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, x-r, y-r, 2*r, 2*r, c)
	case "triangle":
		fmt.Fprintf(w, `<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="%s"/>`, x, y-r-1, x-r-1, y+r, x+r+1, y+r, c)
	case "down":
		fmt.Fprintf(w, `<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="white" stroke="%s" stroke-width="1.5"/>`, x, y+r+1, x-r-1, y-r, x+r+1, y-r, c)
	case "diamond":
		fmt.Fprintf(w, `<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="%s"/>`, x, y-r-1, x+r+1, y, x, y+r+1, x-r-1, y, c)
	case "cross":
		fmt.Fprintf(w, `<path d="M%.1f %.1fL%.1f %.1fM%.1f %.1fL%.1f %.1f" stroke="%s" stroke-width="2"/>`, x-r, y-r, x+r, y+r, x-r, y+r, x+r, y-r, c)
	case "plus":
		fmt.Fprintf(w, `<path d="M%.1f %.1fL%.1f %.1fM%.1f %.1fL%.1f %.1f" stroke="%s" stroke-width="2"/>`, x-r-1, y, x+r+1, y, x, y-r-1, x, y+r+1, c)
	default: // star: an open circle with a dot
		fmt.Fprintf(w, `<circle cx="%.1f" cy="%.1f" r="%.1f" fill="white" stroke="%s" stroke-width="1.5"/><circle cx="%.1f" cy="%.1f" r="1.5" fill="%s"/>`, x, y, r, c, x, y, c)
	}
	fmt.Fprintln(w)
}

const (
	chartW, chartH         = 820, 460
	padL, padR, padT, padB = 80, 210, 44, 56
)

func svgOpen(w io.Writer, title string) {
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartW, chartH, chartW, chartH)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(w, `<text x="%d" y="26" font-size="15" font-weight="bold">%s</text>`+"\n", padL, html.EscapeString(title))
}

// axis maps values to pixels along one axis, linear or logarithmic.
type axis struct {
	lo, hi float64 // data range (log10 of it when log)
	log    bool
	p0, p1 float64 // pixels of lo and hi
	label  string
	format func(float64) string
}

func newAxis(lo, hi float64, log bool, p0, p1 float64, label string, format func(float64) string) *axis {
	if log {
		lo, hi = math.Log10(max(lo, 1e-9)), math.Log10(max(hi, 1e-9))
		lo, hi = math.Floor(lo), math.Ceil(hi)
		if hi <= lo {
			hi = lo + 1
		}
	} else {
		if hi <= lo {
			hi = lo + 1
		}
		step := niceStep((hi - lo) / 5)
		lo, hi = math.Floor(lo/step)*step, math.Ceil(hi/step)*step
	}
	return &axis{lo: lo, hi: hi, log: log, p0: p0, p1: p1, label: label, format: format}
}

func (a *axis) pos(v float64) float64 {
	if a.log {
		v = math.Log10(max(v, math.Pow(10, a.lo)))
	}
	return a.p0 + (a.p1-a.p0)*(v-a.lo)/(a.hi-a.lo)
}

// ticks returns the tick values.
func (a *axis) ticks() []float64 {
	var out []float64
	if a.log {
		for d := a.lo; d <= a.hi+1e-9; d++ {
			out = append(out, math.Pow(10, d))
		}
		return out
	}
	step := niceStep((a.hi - a.lo) / 5)
	for v := a.lo; v <= a.hi+step/1e6; v += step {
		out = append(out, v)
	}
	return out
}

// niceStep rounds a step up to 1, 2 or 5 x a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// drawAxes draws the frame, the grid, the ticks and the labels of x and y.
func drawAxes(w io.Writer, x, y *axis) {
	left, right, top, bottom := float64(padL), float64(chartW-padR), float64(padT), float64(chartH-padB)
	for _, v := range x.ticks() {
		px := x.pos(v)
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e4e4e4"/>`+"\n", px, top, px, bottom)
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", px, bottom, px, bottom+5)
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", px, bottom+18, html.EscapeString(x.format(v)))
	}
	for _, v := range y.ticks() {
		py := y.pos(v)
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e4e4e4"/>`+"\n", left, py, right, py)
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", left-5, py, left, py)
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-8, py+4, html.EscapeString(y.format(v)))
	}
	fmt.Fprintf(w, `<line class="x-axis" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", left, bottom, right, bottom)
	fmt.Fprintf(w, `<line class="y-axis" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", left, top, left, bottom)
	fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", (left+right)/2, chartH-12, html.EscapeString(x.label))
	my := (top + bottom) / 2
	fmt.Fprintf(w, `<text x="18" y="%.1f" transform="rotate(-90 18 %.1f)" text-anchor="middle">%s</text>`+"\n", my, my, html.EscapeString(y.label))
}

// legend draws one entry per series, with its line and marker.
func legend(w io.Writer, names []string, styles []seriesStyle) {
	fmt.Fprintln(w, `<g class="legend">`)
	defer fmt.Fprintln(w, `</g>`)
	for i, name := range names {
		s := styles[i]
		ly := float64(padT + 8 + 18*i)
		x0 := float64(chartW - padR + 14)
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2" stroke-dasharray="%s"/>`+"\n", x0, ly, x0+30, ly, s.color, s.dash)
		marker(w, s, x0+15, ly)
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f">%s</text>`+"\n", x0+38, ly+4, html.EscapeString(name))
	}
}

// line is one series of a line chart: points (x, y), optionally with an
// interval [lo, hi] at each point.
type line struct {
	name   string
	style  seriesStyle
	x, y   []float64
	lo, hi []float64
}

// writeLines draws a line chart.
func writeLines(w io.Writer, title, xLabel, yLabel string, logY bool, yFormat func(float64) string, lines []line) error {
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, l := range lines {
		for i := range l.x {
			xlo, xhi = min(xlo, l.x[i]), max(xhi, l.x[i])
			v := l.y[i]
			if l.hi != nil {
				v = max(v, l.hi[i])
			}
			if logY && !(l.y[i] > 0) {
				continue
			}
			ylo, yhi = min(ylo, l.y[i]), max(yhi, v)
			if l.lo != nil && (!logY || l.lo[i] > 0) {
				ylo = min(ylo, l.lo[i])
			}
		}
	}
	if math.IsInf(xlo, 0) {
		xlo, xhi, ylo, yhi = 0, 1, 0, 1
	}
	if !logY {
		ylo = min(ylo, 0)
	}
	if xhi == xlo {
		xlo, xhi = xlo-0.1, xhi+0.1
	}
	x := newAxis(xlo, xhi, false, padL, chartW-padR, xLabel, func(v float64) string { return fmt.Sprintf("%.2g", v) })
	y := newAxis(ylo, yhi, logY, chartH-padB, padT, yLabel, yFormat)
	svgOpen(w, title)
	drawAxes(w, x, y)
	var names []string
	var styles []seriesStyle
	for _, l := range lines {
		var pts []string
		for i := range l.x {
			if logY && !(l.y[i] > 0) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x.pos(l.x[i]), y.pos(l.y[i])))
			if l.lo != nil && l.hi[i] > l.lo[i] {
				px := x.pos(l.x[i])
				fmt.Fprintf(w, `<path d="M%.1f %.1fL%.1f %.1fM%.1f %.1fL%.1f %.1fM%.1f %.1fL%.1f %.1f" stroke="%s" stroke-width="1" opacity="0.7"/>`+"\n",
					px, y.pos(l.lo[i]), px, y.pos(l.hi[i]), px-3, y.pos(l.lo[i]), px+3, y.pos(l.lo[i]), px-3, y.pos(l.hi[i]), px+3, y.pos(l.hi[i]), l.style.color)
			}
		}
		fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="2" stroke-dasharray="%s" points="%s"/>`+"\n", l.style.color, l.style.dash, strings.Join(pts, " "))
		for i := range l.x {
			if logY && !(l.y[i] > 0) {
				continue
			}
			marker(w, l.style, x.pos(l.x[i]), y.pos(l.y[i]))
		}
		names = append(names, l.name)
		styles = append(styles, l.style)
	}
	legend(w, names, styles)
	_, err := fmt.Fprintln(w, "</svg>")
	return err
}

// barGroup is one group of bars (a category), one value per series.
// style, when set on every group of a one-series chart, draws the group's
// bar in it (the policy's colour, with its marker on top) and makes the
// legend name the groups.
type barGroup struct {
	label  string
	values []float64
	style  *seriesStyle
}

// writeBars draws grouped bars: a group per category (xLabel names what
// the categories are), a bar per series, on a linear y axis from 0 or
// (logY) a logarithmic one whose bars rise from the axis' lowest decade,
// so values orders of magnitude apart stay readable side by side. Both
// axes are drawn, and a legend whenever there is more than one series or
// the groups have styles of their own.
func writeBars(w io.Writer, title, xLabel, yLabel string, logY bool, yFormat func(float64) string, series []string, styles []seriesStyle, groups []barGroup) error {
	lo, hi := math.Inf(1), 0.0
	longest := 0
	byGroup := len(series) == 1 && len(groups) > 0
	for _, g := range groups {
		longest = max(longest, len(g.label))
		byGroup = byGroup && g.style != nil
		for _, v := range g.values {
			hi = max(hi, v)
			if v > 0 {
				lo = min(lo, v)
			}
		}
	}
	if hi <= 0 {
		hi = 1
	}
	var y *axis
	if logY && lo <= hi {
		y = newAxis(lo, hi, true, chartH-padB, padT, yLabel, yFormat)
	} else {
		y = newAxis(0, hi*1.08, false, chartH-padB, padT, yLabel, yFormat)
	}
	x := &axis{lo: 0, hi: 1, p0: padL, p1: chartW - padR, label: xLabel, format: func(float64) string { return "" }}
	// The category labels slant down from the axis: the chart grows to
	// hold the longest, then the x axis' title.
	labelDrop := 16 + int(float64(longest)*6.2*0.5)
	height := max(chartH, chartH-padB+labelDrop+26)
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartW, height, chartW, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(w, `<text x="%d" y="26" font-size="15" font-weight="bold">%s</text>`+"\n", padL, html.EscapeString(title))
	// y axis and grid; category labels below each group.
	left, right, bottom := float64(padL), float64(chartW-padR), float64(chartH-padB)
	for _, v := range y.ticks() {
		py := y.pos(v)
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e4e4e4"/>`+"\n", left, py, right, py)
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", left-5, py, left, py)
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-8, py+4, html.EscapeString(yFormat(v)))
	}
	fmt.Fprintf(w, `<line class="x-axis" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", left, bottom, right, bottom)
	fmt.Fprintf(w, `<line class="y-axis" x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", left, padT, left, bottom)
	my := float64(padT+chartH-padB) / 2
	fmt.Fprintf(w, `<text x="18" y="%.1f" transform="rotate(-90 18 %.1f)" text-anchor="middle">%s</text>`+"\n", my, my, html.EscapeString(yLabel))
	fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", (left+right)/2, height-10, html.EscapeString(xLabel))
	n := max(len(groups), 1)
	slot := (x.p1 - x.p0) / float64(n)
	bw := slot * 0.8 / float64(max(len(series), 1))
	for gi, g := range groups {
		gx := x.p0 + slot*float64(gi) + slot*0.1
		for si, v := range g.values {
			s := styles[si]
			if byGroup {
				s = *g.style
			}
			by := y.pos(v)
			bx := gx + bw*float64(si)
			fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" stroke="#333" stroke-width="0.5"/>`+"\n", bx, by, bw*0.92, bottom-by, s.color)
			if byGroup && s.marker != "" {
				marker(w, s, bx+bw*0.46, by-7)
			}
			if len(series) <= 3 && len(groups)*len(series) <= 16 {
				fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10">%s</text>`+"\n", bx+bw*0.46, by-14, html.EscapeString(yFormat(v)))
			}
		}
		lx := x.p0 + slot*(float64(gi)+0.5)
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", lx, bottom, lx, bottom+5)
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="end" transform="rotate(-30 %.1f %.1f)">%s</text>`+"\n", lx, bottom+16, lx, bottom+16, html.EscapeString(g.label))
	}
	switch {
	case byGroup:
		var names []string
		var gs []seriesStyle
		for _, g := range groups {
			names, gs = append(names, g.label), append(gs, *g.style)
		}
		legend(w, names, gs)
	case len(series) > 1:
		fmt.Fprintln(w, `<g class="legend">`)
		for i, name := range series {
			ly := float64(padT + 8 + 18*i)
			x0 := float64(chartW - padR + 14)
			fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="14" height="12" fill="%s" stroke="#333" stroke-width="0.5"/>`+"\n", x0, ly-6, styles[i].color)
			fmt.Fprintf(w, `<text x="%.1f" y="%.1f">%s</text>`+"\n", x0+20, ly+4, html.EscapeString(name))
		}
		fmt.Fprintln(w, `</g>`)
	}
	_, err := fmt.Fprintln(w, "</svg>")
	return err
}

// msTick labels milliseconds.
func msTick(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gs", math.Round(v/100)/10)
	case v >= 1:
		return fmt.Sprintf("%gms", math.Round(v))
	}
	return fmt.Sprintf("%.2gms", v)
}

// pctTick labels percentages, with the decimals small steps need (0.5%,
// 2.5%, 40%).
func pctTick(v float64) string { return fmt.Sprintf("%g%%", math.Round(v*100)/100) }

func numTick(v float64) string { return fmt.Sprintf("%g", math.Round(v*1000)/1000) }

// writeSVGFiles writes each named chart into dir (created if missing).
func writeSVGFiles(dir string, files []namedWriter) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write charts: %w", err)
	}
	for _, f := range files {
		if err := writeFile(filepath.Join(dir, f.name), f.write); err != nil {
			return fmt.Errorf("write charts: %w", err)
		}
	}
	return nil
}

type namedWriter struct {
	name  string
	write func(io.Writer) error
}

// WriteCharts writes one run's charts into dir: ttft_cdf.svg (the TTFT
// distribution per policy), hit_rate.svg, load_dispersion.svg,
// cross_region.svg (requests served outside their origin region, and
// egress), residency.svg (requests refused by the receiving region's
// re-check, and violations) and report.json with every figure.
func (r *Report) WriteCharts(dir string) error {
	return writeSVGFiles(dir, append(r.charts(), namedWriter{"report.json", func(w io.Writer) error { return writeIndentedJSON(w, r) }}))
}

func (r *Report) charts() []namedWriter {
	// One bar per policy, in the policy's own colour with its marker on
	// top, as in the line charts.
	one := func(v func(Result) float64) []barGroup {
		var g []barGroup
		for _, x := range r.Results {
			st := styleFor(x.Policy)
			g = append(g, barGroup{label: x.Policy, values: []float64{v(x)}, style: &st})
		}
		return g
	}
	bars := func(title, y string, f func(float64) string, v func(Result) float64) func(io.Writer) error {
		return func(w io.Writer) error {
			return writeBars(w, title, "policy", y, false, f, []string{""}, []seriesStyle{{color: "#4c78a8"}}, one(v))
		}
	}
	return []namedWriter{
		{"ttft_cdf.svg", r.writeTTFTCDF},
		{"hit_rate.svg", bars("Prefix hit rate (blocks) per policy ("+r.Workload+")", "hit rate", pctTick, func(x Result) float64 { return 100 * x.HitRate })},
		{"load_dispersion.svg", bars("Load dispersion (variance / mean of per-pod concurrency)", "dispersion", numTick, func(x Result) float64 { return x.LoadDispersion })},
		{"cross_region.svg", func(w io.Writer) error {
			var g []barGroup
			for _, x := range r.Results {
				g = append(g, barGroup{label: x.Policy, values: []float64{100 * share(x.CrossRegionRequests, x.Requests), 1000 * x.EgressGB}})
			}
			return writeBars(w, "Served outside the origin region (% of requests) and egress (MB)", "policy", "% of requests / MB", false, numTick,
				[]string{"cross-region %", "egress MB"}, []seriesStyle{styleOf(10), styleOf(1)}, g)
		}},
		{"residency.svg", func(w io.Writer) error {
			var g []barGroup
			for _, x := range r.Results {
				g = append(g, barGroup{label: x.Policy, values: []float64{float64(x.ResidencyRefused), float64(x.ResidencyViolations)}})
			}
			return writeBars(w, "Residency: refused at the receiving region, and violations (served where the rule forbids)", "policy", "requests", false, numTick,
				[]string{"refused at the re-check", "violations"}, []seriesStyle{{color: "#e0a030"}, {color: "#c44e52"}}, g)
		}},
	}
}

func share(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}

// writeTTFTCDF draws each policy's TTFT distribution on a log time axis.
func (r *Report) writeTTFTCDF(w io.Writer) error {
	var lines []line
	for _, x := range r.Results {
		if len(x.TTFTQuantiles) == 0 {
			continue
		}
		l := line{name: x.Policy, style: styleFor(x.Policy)}
		n := len(x.TTFTQuantiles) - 1
		for k, v := range x.TTFTQuantiles {
			l.x = append(l.x, float64(k)/float64(n))
			l.y = append(l.y, v)
		}
		lines = append(lines, l)
	}
	return writeCDF(w, "TTFT distribution per policy ("+r.Workload+")", lines)
}

// writeCDF draws quantile curves with time on a log x axis and the fraction
// of requests on y; markers every 10%.
func writeCDF(w io.Writer, title string, lines []line) error {
	lo, hi := math.Inf(1), 0.0
	for _, l := range lines {
		for _, v := range l.y {
			if v > 0 {
				lo, hi = min(lo, v), max(hi, v)
			}
		}
	}
	if hi == 0 {
		lo, hi = 1, 10
	}
	x := newAxis(lo, hi, true, padL, chartW-padR, "time to first token (log scale)", msTick)
	y := newAxis(0, 1, false, chartH-padB, padT, "fraction of requests", func(v float64) string { return fmt.Sprintf("%.1f", v) })
	svgOpen(w, title)
	drawAxes(w, x, y)
	var names []string
	var styles []seriesStyle
	for _, l := range lines {
		var pts []string
		n := len(l.y)
		for k := range l.y {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x.pos(l.y[k]), y.pos(l.x[k])))
		}
		fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="2" stroke-dasharray="%s" points="%s"/>`+"\n", l.style.color, l.style.dash, strings.Join(pts, " "))
		for k := 0; k < n; k += max(n/10, 1) {
			marker(w, l.style, x.pos(l.y[k]), y.pos(l.x[k]))
		}
		names = append(names, l.name)
		styles = append(styles, l.style)
	}
	legend(w, names, styles)
	_, err := fmt.Fprintln(w, "</svg>")
	return err
}
