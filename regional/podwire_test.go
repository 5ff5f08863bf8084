package regional

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// TestAppendPostLikeWrite: appendPost writes what http.Request.Write
// writes for the same POST, whatever the header holds, and declines
// exactly the headers the transport refuses (podConns.eligible).
func TestAppendPostLikeWrite(t *testing.T) {
	names := []string{"Content-Type", "User-Agent", "Accept", "X-Request-Id", "X-Meridian-Pod", "Host", "Content-Length",
		"Transfer-Encoding", "Trailer", "Expect", "X-Multi", "x-lower", "Bad Name", "A", "Z-Last", "X-Ünicode"}
	values := []string{"", "application/json", "  padded\t", "a b", "tab\tinside", "x\x00y", "cr\rlf", "line\nbreak",
		"\x7f", "ünïcode", "Go-http-client/1.1", " "}
	rapid.Check(t, func(rt *rapid.T) {
		hdr := http.Header{}
		for _, k := range rapid.SliceOfNDistinct(rapid.SampledFrom(names), 0, 8, func(s string) string { return s }).Draw(rt, "names") {
			hdr[k] = rapid.SliceOfN(rapid.SampledFrom(values), 0, 3).Draw(rt, "values")
		}
		host := rapid.SampledFrom([]string{"127.0.0.1:8000", "pod-1.ns.svc:80", "[::1]:9000"}).Draw(rt, "host")
		path := rapid.SampledFrom([]string{"/v1/chat/completions", "/base/v1/completions", "/"}).Draw(rt, "path")
		body := strings.Repeat("b", rapid.IntRange(0, 3000).Draw(rt, "body"))

		req, err := http.NewRequest(http.MethodPost, "http://"+host+path, strings.NewReader(body))
		if err != nil {
			rt.Fatal(err)
		}
		for k, v := range hdr {
			req.Header[k] = v
		}
		var want bytes.Buffer
		eligible := (&podConns{}).eligible(req)
		if err := req.Write(&want); err != nil {
			rt.Fatal(err)
		}
		gotHost, gotPath, ok := podTarget("http://" + host + path)
		if !ok || gotHost != host || gotPath != path {
			rt.Fatalf("podTarget: %q %q %v", gotHost, gotPath, ok)
		}
		got, ok := appendPost([]byte("prefix"), host, path, podFields(nil, hdr, func(string) bool { return true }, nil), []byte(body))
		if ok != eligible {
			rt.Fatalf("appendPost ok %v, the transport's podConns would send it: %v (header %q)", ok, eligible, hdr)
		}
		if ok && !bytes.Equal(got[len("prefix"):], want.Bytes()) {
			rt.Fatalf("header %q:\n got %q\nwant %q", hdr, got[len("prefix"):], want.Bytes())
		}
	})
}

// TestPodFields: the relay's filter and its own fields (which replace the
// client's of the same name) make the fields sent, sorted by name.
func TestPodFields(t *testing.T) {
	in := http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer k"}, "X-Meridian-Pod": {"forged"}, "Accept": {"*/*"}}
	add := http.Header{"X-Meridian-Pod": {"p1"}}
	got := podFields(nil, in, func(k string) bool { return k != "Authorization" }, add)
	want := []headerField{{"Accept", []string{"*/*"}}, {"Content-Type", []string{"application/json"}}, {"X-Meridian-Pod", []string{"p1"}}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range got {
		if got[i].key != want[i].key || strings.Join(got[i].values, ",") != strings.Join(want[i].values, ",") {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

// TestPodTarget: only URLs appendPost writes as Write would are taken.
func TestPodTarget(t *testing.T) {
	for url, want := range map[string]bool{
		"http://10.0.0.1:8000/v1/chat/completions":   true,
		"http://[fe80::1]:8000/v1/chat/completions":  true,
		"http://pod.example:80/base/v1/completions":  true,
		"https://10.0.0.1:8000/v1/chat/completions":  false,
		"http://10.0.0.1/v1/chat/completions":        false, // no port: the transport's default
		"http://user:pw@10.0.0.1:8000/v1":            false,
		"http://10.0.0.1:8000/v1/a b":                false,
		"http://10.0.0.1:8000/v1/%41":                false,
		"http://[fe80::1%25eth0]:8000/v1":            false,
		"http://10.0.0.1:8000":                       false,
		"http://10.0.0.1:8000/v1?x=1":                false,
		"http://ünicode.example:8000/v1/completions": false,
	} {
		if _, _, got := podTarget(url); got != want {
			t.Errorf("podTarget(%q) = %v, want %v", url, got, want)
		}
	}
}
