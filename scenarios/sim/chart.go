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

// chartColors are the series colours, one per policy in report order.
var chartColors = []string{"#d62728", "#ff7f0e", "#8c564b", "#2ca02c", "#1f77b4", "#7f7f7f", "#9467bd", "#e377c2"}

// WriteCharts writes ttft_cdf.svg, hit_rate.svg and load_dispersion.svg
// into dir (created if missing), and report.json with every figure.
func (r *Report) WriteCharts(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write charts: %w", err)
	}
	files := []struct {
		name  string
		write func(io.Writer) error
	}{
		{"ttft_cdf.svg", r.writeTTFTCDF},
		{"hit_rate.svg", func(w io.Writer) error {
			return r.writeBars(w, "Prefix hit rate (blocks)", "%", func(x Result) float64 { return 100 * x.HitRate })
		}},
		{"load_dispersion.svg", func(w io.Writer) error {
			return r.writeBars(w, "Load dispersion (variance / mean of per-pod concurrency)", "", func(x Result) float64 { return x.LoadDispersion })
		}},
		{"report.json", func(w io.Writer) error { return writeIndentedJSON(w, r) }},
	}
	for _, f := range files {
		path := filepath.Join(dir, f.name)
		out, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("write charts: %w", err)
		}
		err = f.write(out)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write charts: %s: %w", path, err)
		}
	}
	return nil
}

const (
	chartW, chartH         = 760, 440
	padL, padR, padT, padB = 70, 170, 40, 50
)

func svgOpen(w io.Writer, title string) {
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartW, chartH, chartW, chartH)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(w, `<text x="%d" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", padL, html.EscapeString(title))
}

// writeTTFTCDF draws each policy's TTFT distribution on a log time axis.
func (r *Report) writeTTFTCDF(w io.Writer) error {
	lo, hi := math.Inf(1), 0.0
	for _, x := range r.Results {
		for _, v := range x.TTFTQuantiles {
			if v > 0 {
				lo, hi = min(lo, v), max(hi, v)
			}
		}
	}
	if hi == 0 {
		lo, hi = 1, 10
	}
	llo, lhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if lhi <= llo {
		lhi = llo + 1
	}
	pw, ph := float64(chartW-padL-padR), float64(chartH-padT-padB)
	xOf := func(v float64) float64 {
		return padL + pw*(math.Log10(max(v, math.Pow(10, llo)))-llo)/(lhi-llo)
	}
	yOf := func(q float64) float64 { return padT + ph*(1-q) }
	svgOpen(w, "TTFT CDF per policy ("+r.Workload+")")
	for d := llo; d <= lhi; d++ {
		x := xOf(math.Pow(10, d))
		fmt.Fprintf(w, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, padT, x, chartH-padB)
		fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, chartH-padB+16, tick(math.Pow(10, d)))
	}
	for q := 0.0; q <= 1.0001; q += 0.25 {
		y := yOf(q)
		fmt.Fprintf(w, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", padL, y, chartW-padR, y)
		fmt.Fprintf(w, `<text x="%d" y="%.1f" text-anchor="end">%.2f</text>`+"\n", padL-6, y+4, q)
	}
	fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle">time to first token (log scale)</text>`+"\n", padL+pw/2, chartH-12)
	fmt.Fprintf(w, `<text x="16" y="%.1f" transform="rotate(-90 16 %.1f)" text-anchor="middle">fraction of requests</text>`+"\n", padT+ph/2, padT+ph/2)
	for i, x := range r.Results {
		if len(x.TTFTQuantiles) == 0 {
			continue
		}
		var pts []string
		n := len(x.TTFTQuantiles) - 1
		for k, v := range x.TTFTQuantiles {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(v), yOf(float64(k)/float64(n))))
		}
		c := chartColors[i%len(chartColors)]
		fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, strings.Join(pts, " "))
		ly := padT + 10 + 18*i
		fmt.Fprintf(w, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", chartW-padR+12, ly, chartW-padR+32, ly, c)
		fmt.Fprintf(w, `<text x="%d" y="%d">%s</text>`+"\n", chartW-padR+38, ly+4, html.EscapeString(x.Policy))
	}
	_, err := fmt.Fprintln(w, "</svg>")
	return err
}

// tick labels a power of ten of milliseconds.
func tick(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%gs", v/1000)
	}
	return fmt.Sprintf("%gms", v)
}

// writeBars draws one bar per policy.
func (r *Report) writeBars(w io.Writer, title, unit string, value func(Result) float64) error {
	hi := 0.0
	for _, x := range r.Results {
		hi = max(hi, value(x))
	}
	if hi == 0 {
		hi = 1
	}
	hi *= 1.15
	pw, ph := float64(chartW-padL-padR), float64(chartH-padT-padB)
	svgOpen(w, title)
	n := max(len(r.Results), 1)
	slot := pw / float64(n)
	fmt.Fprintf(w, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", padL, chartH-padB, chartW-padR, chartH-padB)
	for i, x := range r.Results {
		v := value(x)
		bh := ph * v / hi
		bx := padL + slot*float64(i) + slot*0.15
		by := float64(chartH-padB) - bh
		fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", bx, by, slot*0.7, bh, chartColors[i%len(chartColors)])
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle">%.2f%s</text>`+"\n", bx+slot*0.35, by-5, v, unit)
		fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", bx+slot*0.35, chartH-padB+16, html.EscapeString(x.Policy))
	}
	_, err := fmt.Fprintln(w, "</svg>")
	return err
}
