package sim

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestRunReportHTML: one run's --report is one self-contained page (no
// script, no stylesheet or image from elsewhere, no address but the SVG
// namespace) with the run's parameters, and every chart has both axes
// with ticks and titles and a legend: each policy named, in its own
// colour, dash pattern and marker, so no policy hides under another.
func TestRunReportHTML(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Workload.Kind = WorkloadRAG
	cfg.Workload.Duration = 15 * time.Second
	cfg.Fleet.PodsPerRegion = 2
	cfg.Policies = []string{PolicyRoundRobin, PolicySessionAffinity, PolicyGORGO, PolicyCacheLocal, PolicyMeridian}
	path := filepath.Join(t.TempDir(), "report.html")
	if err := Execute(context.Background(), cfg, nil, Output{Stdout: &strings.Builder{}, Report: path}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, want := range []string{"<h2>Parameters</h2>", "<h2>Results</h2>", "workload"} {
		if !strings.Contains(page, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	outside := strings.ReplaceAll(page, `xmlns="http://www.w3.org/2000/svg"`, "")
	if urls := regexp.MustCompile(`(?i)(https?:|ftp:)?//[a-z0-9-]+(\.[a-z0-9-]+)+`).FindAllString(outside, -1); len(urls) > 0 {
		t.Errorf("report names addresses: %v", urls)
	}
	for _, bad := range []string{"<script", "<link", "<img", "<iframe", "@import", "url(", "%!"} {
		if strings.Contains(page, bad) {
			t.Errorf("report is not self-contained: has %q", bad)
		}
	}

	charts := regexp.MustCompile(`(?s)<h2>([^<]*)</h2>\s*<figure>(<svg.*?</svg>)`).FindAllStringSubmatch(page, -1)
	if len(charts) != 5 {
		t.Fatalf("%d charts, want 5", len(charts))
	}
	perPolicy := map[string]bool{"ttft_cdf": true, "hit_rate": true, "load_dispersion": true}
	legendEntry := regexp.MustCompile(`<line [^>]*stroke="([^"]*)" stroke-width="2" stroke-dasharray="([^"]*)"/>\s*<(circle|rect|polygon|path)[^>]*>(?:<circle[^>]*>)?\s*<text[^>]*>([^<]*)</text>`)
	for _, c := range charts {
		name, svg := c[1], c[2]
		if !strings.Contains(svg, `class="x-axis"`) || !strings.Contains(svg, `class="y-axis"`) {
			t.Errorf("%s: an axis is missing", name)
		}
		if strings.Count(svg, `text-anchor="end"`) < 3 {
			t.Errorf("%s: no tick labels", name)
		}
		if !regexp.MustCompile(`<text [^>]*text-anchor="middle"[^>]*>[a-z]`).MatchString(svg) || !strings.Contains(svg, `rotate(-90`) {
			t.Errorf("%s: an axis title is missing", name)
		}
		_, leg, ok := strings.Cut(svg, `<g class="legend">`)
		if !ok {
			t.Errorf("%s: no legend", name)
			continue
		}
		leg, _, _ = strings.Cut(leg, "</g>")
		if !perPolicy[name] {
			if strings.Count(leg, "<text") < 2 {
				t.Errorf("%s: the legend names %d series", name, strings.Count(leg, "<text"))
			}
			continue
		}
		entries := legendEntry.FindAllStringSubmatch(leg, -1)
		styles := map[string]string{}
		for _, e := range entries {
			key := e[1] + "|" + e[2] + "|" + e[3]
			if other, dup := styles[key]; dup {
				t.Errorf("%s: %s and %s are drawn alike (%s)", name, other, e[4], key)
			}
			styles[key] = e[4]
		}
		for _, p := range cfg.Policies {
			if !strings.Contains(leg, ">"+p+"<") {
				t.Errorf("%s: the legend does not name %s", name, p)
			}
		}
		if len(entries) != len(cfg.Policies) {
			t.Errorf("%s: %d legend entries with a line and a marker, want %d", name, len(entries), len(cfg.Policies))
		}
	}
}
