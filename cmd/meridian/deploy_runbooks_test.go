package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// runbookBase is where the alerts' runbook_url point: docs/runbooks/ of
// the repository, as rendered by its forge.
const runbookBase = "https://github.com/meridian-llm/meridian/blob/main/docs/runbooks/"

var runbookDir = filepath.Join(deployRoot, "..", "docs", "runbooks")

// githubAnchor is the anchor a forge gives a Markdown heading.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// runbookSections returns the "## " sections of a runbook file by anchor.
func runbookSections(t *testing.T, file string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(runbookDir, file))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var anchor string
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			anchor = githubAnchor(h)
			out[anchor] = ""
			continue
		}
		if anchor != "" {
			out[anchor] += line + "\n"
		}
	}
	return out
}

// TestDeployAlertRunbooks: every alert has a runbook_url to a section of
// docs/runbooks/ that says what it means, how to confirm it and what to do;
// the promtool tests expect the same URL; every runbook section is some
// alert's, and the runbooks' links between sections resolve.
func TestDeployAlertRunbooks(t *testing.T) {
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	b, err := os.ReadFile(filepath.Join(deployRoot, "prometheus", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	urls := map[string]string{}
	used := map[string]bool{} // file#anchor
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			url := r.Annotations["runbook_url"]
			urls[r.Alert] = url
			rel, ok := strings.CutPrefix(url, runbookBase)
			file, anchor, hasAnchor := strings.Cut(rel, "#")
			if !ok || !hasAnchor || filepath.Base(file) != file || !strings.HasSuffix(file, ".md") {
				t.Errorf("alert %s: runbook_url %q is not %sFILE.md#SECTION", r.Alert, url, runbookBase)
				continue
			}
			if _, err := os.Stat(filepath.Join(runbookDir, file)); err != nil {
				t.Errorf("alert %s: runbook %s: %v", r.Alert, file, err)
				continue
			}
			section, ok := runbookSections(t, file)[anchor]
			if !ok {
				t.Errorf("alert %s: %s has no section #%s", r.Alert, file, anchor)
				continue
			}
			if anchor != strings.ToLower(r.Alert) {
				t.Errorf("alert %s: its section is #%s, want one named after the alert", r.Alert, anchor)
			}
			for _, part := range []string{"**Meaning.**", "**Confirm.**", "**Act.**"} {
				if !strings.Contains(section, part) {
					t.Errorf("alert %s: runbook %s#%s has no %s part", r.Alert, file, anchor, part)
				}
			}
			used[file+"#"+anchor] = true
		}
	}
	if len(urls) < 20 {
		t.Fatalf("only %d alerts read from alerts.yaml", len(urls))
	}

	// The promtool tests compare annotations exactly: they must expect the
	// rule's runbook_url.
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []struct {
					ExpAnnotations map[string]string `yaml:"exp_annotations"`
				} `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	b, err = os.ReadFile(filepath.Join(deployRoot, "prometheus", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &tests); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests.Tests {
		for _, art := range tc.AlertRuleTest {
			for _, ea := range art.ExpAlerts {
				if ea.ExpAnnotations != nil && ea.ExpAnnotations["runbook_url"] != urls[art.Alertname] {
					t.Errorf("alerts_test.yaml expects %s with runbook_url %q, the rule has %q", art.Alertname, ea.ExpAnnotations["runbook_url"], urls[art.Alertname])
				}
			}
		}
	}

	// Every section is an alert's, and every link between runbooks resolves.
	entries, err := os.ReadDir(runbookDir)
	if err != nil {
		t.Fatal(err)
	}
	link := regexp.MustCompile(`\]\(([a-z-]*\.md)?(?:#([a-z0-9_-]+))?\)`)
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".md") {
			continue
		}
		for anchor := range runbookSections(t, e.Name()) {
			if e.Name() != "README.md" && !used[e.Name()+"#"+anchor] {
				t.Errorf("%s#%s is no alert's runbook", e.Name(), anchor)
			}
		}
		body, _ := os.ReadFile(filepath.Join(runbookDir, e.Name()))
		for _, m := range link.FindAllStringSubmatch(string(body), -1) {
			file, anchor := m[1], m[2]
			if file == "" {
				file = e.Name()
			}
			if _, err := os.Stat(filepath.Join(runbookDir, file)); err != nil {
				t.Errorf("%s links to %s, which does not exist", e.Name(), file)
				continue
			}
			if _, ok := runbookSections(t, file)[anchor]; anchor != "" && !ok {
				t.Errorf("%s links to %s#%s, which is no section", e.Name(), file, anchor)
			}
		}
	}
}
