package discovery

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// writeFile replaces path's content atomically, as a careful writer (and
// Kubernetes, for a mounted ConfigMap) does.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp, err := os.CreateTemp(filepath.Dir(path), ".pods-*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmp.WriteString(content); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		t.Fatal(err)
	}
}

func newFile(t *testing.T, cfg FileConfig) (*File, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	f, err := NewFile(cfg, Deps{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return f, reg
}

const twoPods = `
pods:
  - name: a
    endpoint: http://10.0.0.1:8000
  - name: b
    endpoint: http://vllm-b.local:8000
    model: other
    kv_events: tcp://vllm-b.local:5557
`

// The file is re-read when it changes, on the source's own timer.
func TestFileFollowsChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pods.yaml")
	writeFile(t, path, twoPods)
	f, reg := newFile(t, FileConfig{Path: path, Interval: 5 * time.Millisecond, Model: "llama", Profile: "h100"})
	r := start(t, f)
	got := r.waitFor(t, "a,b")
	want := []Pod{
		{Name: "a", Endpoint: "http://10.0.0.1:8000", Model: "llama", Profile: "h100", Addr: netip.MustParseAddr("10.0.0.1")},
		{Name: "b", Endpoint: "http://vllm-b.local:8000", Model: "other", Profile: "h100", KVEvents: "tcp://vllm-b.local:5557"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pods\n%+v\nwant\n%+v", got, want)
	}
	// JSON, a bare list: b left, c joined.
	writeFile(t, path, `[{"name": "a", "endpoint": "http://10.0.0.1:8000"}, {"name": "c", "endpoint": "https://10.0.0.3"}]`)
	r.waitFor(t, "a,c")
	writeFile(t, path, "pods: []\n")
	r.waitFor(t, "")
	if got := lookups(t, reg); got[resultError] != 0 || got[resultOK] < 2 || got[resultNotFound] < 1 {
		t.Fatalf("lookups by result %v", got)
	}
}

// An invalid, empty or missing file keeps the last good set; Refresh
// reports why; a good file is taken again.
func TestFileInvalidKeepsTheLastSet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pods.yaml")
	writeFile(t, path, twoPods)
	f, reg := newFile(t, FileConfig{Path: path, Interval: time.Hour})
	r := start(t, f)
	r.waitFor(t, "a,b")
	_, calls := r.snapshot()

	for _, tc := range []struct {
		content string // "" with remove: the file is gone
		remove  bool
		want    string
	}{
		{content: "pods:\n  - name: a\n    endpoint: ftp://x\n", want: `pods.yaml:2: pods[0]: endpoint "ftp://x": want an http or https URL`},
		{content: "pods:\n  - name: a\n    endpont: http://x\n", want: `unknown key "endpont"`},
		{content: "", want: "empty"},
		{content: "pods: [\n", want: "pods.yaml"},
		{remove: true, want: "no such file"},
	} {
		if tc.remove {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		} else {
			writeFile(t, path, tc.content)
		}
		err := refresh(t, f)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("file %q: Refresh returned %v, want an error with %q", tc.content, err, tc.want)
		}
	}
	if last, c := r.snapshot(); c != calls || podNames(last) != "a,b" {
		t.Fatalf("after invalid files: %d more updates, pods %q; want none and a,b", c-calls, podNames(last))
	}
	if got := lookups(t, reg); got[resultError] != 5 || got[resultOK] != 1 {
		t.Fatalf("lookups by result %v, want 1 ok and 5 error", got)
	}
	writeFile(t, path, "- name: z\n  endpoint: http://10.0.0.26:8000\n")
	if err := refresh(t, f); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "z")
}

// A file that does not exist yet is taken when it appears.
func TestFileAppears(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pods.yaml")
	f, _ := newFile(t, FileConfig{Path: path, Interval: time.Hour})
	r := start(t, f)
	if err := refresh(t, f); err == nil {
		t.Fatal("a missing file: Refresh returned no error")
	}
	writeFile(t, path, twoPods)
	if err := refresh(t, f); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "a,b")
}

// An unchanged file is not read again on the timer; a changed one is.
func TestFileReadOnlyWhenChanged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pods.yaml")
	writeFile(t, path, twoPods)
	f, _ := newFile(t, FileConfig{Path: path, Interval: time.Hour})
	for range 3 {
		if _, err := f.lookup(t.Context(), false); err != nil {
			t.Fatal(err)
		}
	}
	a, err := f.lookup(t.Context(), false)
	if err != nil || !a.skipped {
		t.Fatalf("unchanged file: %+v, %v; want skipped", a, err)
	}
	if a, err := f.lookup(t.Context(), true); err != nil || a.skipped || len(a.pods) != 2 {
		t.Fatalf("forced: %+v, %v; want read", a, err)
	}
	// Rewritten in place, to another size.
	if err := os.WriteFile(path, []byte("pods: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if a, err := f.lookup(t.Context(), false); err != nil || a.skipped || !a.notFound {
		t.Fatalf("changed in place: %+v, %v; want read, no pods", a, err)
	}
}

func TestParseFile(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want string // pod names, or the error's text
	}{
		{"- {name: b, endpoint: 'http://h:1'}\n- {name: a, endpoint: 'http://[fd00::1]:8000'}\n", "a,b"},
		{`{"pods": [{"name": "a", "endpoint": "https://a"}]}`, "a"},
		{"pods: []", ""},
		{"[]", ""},
		{"# only a comment\n", "empty"},
		{"nodes: []", `pods.yaml:1: unknown key "nodes" (want pods)`},
		{"pods: {a: 1}", "pods.yaml:1: want a list of pods"},
		{"- name: a\n  endpoint: http://h\n- name: a\n  endpoint: http://i\n", `pods.yaml:3: pods[1]: name "a": also the pod at line 1`},
		{"- name: ''\n  endpoint: http://h\n", `name ""`},
		{"- name: a b\n  endpoint: http://h\n", `name "a b"`},
		{"- name: a\n", `endpoint "": want an http or https URL`},
		{"- name: a\n  endpoint: http://u:p@h\n", "no credentials"},
		{"- name: a\n  endpoint: http://h:99999\n", `port "99999"`},
		{"- name: a\n  endpoint: http://h\n  kv_events: tcp://h\n", `kv_events "tcp://h": want tcp://host:port`},
		{"- name: a\n  endpoint: http://h\n  replay: udp://h:1\n", `replay "udp://h:1"`},
		{"- name: a\n  endpoint: http://h\n  kv_events: ipc:///run/vllm/kv\n", "a"},
	} {
		pods, err := ParseFile("pods.yaml", []byte(tc.doc), "", "")
		got := podNames(pods)
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, tc.want) || (err == nil) != (got == tc.want) {
			t.Errorf("ParseFile(%q) = %q, want %q", tc.doc, got, tc.want)
		}
	}
}
