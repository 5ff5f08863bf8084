package regional

import (
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/residency"
)

// diskFS is the operating system's file system whose disk can fill up: while
// full, writes fail with ENOSPC, as a full audit volume does.
type diskFS struct {
	audit.OSFS
	full atomic.Bool
}

func (d *diskFS) OpenFile(name string, flag int, perm fs.FileMode) (audit.File, error) {
	f, err := d.OSFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &diskFile{File: f, d: d, name: name}, nil
}

type diskFile struct {
	audit.File
	d    *diskFS
	name string
}

func (f *diskFile) Write(b []byte) (int, error) {
	if f.d.full.Load() {
		return 0, &os.PathError{Op: "write", Path: f.name, Err: syscall.ENOSPC}
	}
	return f.File.Write(b)
}

// auditFixture is a server with the example residency policy and a real
// audit log on a disk that can fill up.
func auditFixture(t *testing.T) (*serverFixture, *audit.Log, *diskFS) {
	t.Helper()
	f := newServerFixture(t, []http.HandlerFunc{okJSON}, nil)
	src, err := os.ReadFile("../deploy/policies/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pol, err := residency.Parse("example.yaml", src)
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := NewStaticControl(pol)
	if err != nil {
		t.Fatal(err)
	}
	disk := &diskFS{}
	cfg := audit.DefaultConfig()
	cfg.Dir, cfg.ControllerID, cfg.HMACKey = t.TempDir(), "ctl-test", []byte("0123456789abcdef0123456789abcdef")
	log, err := audit.Open(cfg, audit.Deps{FS: disk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { disk.full.Store(false); _ = log.Close() })
	f.srv.SetTopology(Topology{Region: "eu-west-1", Control: ctl, Audit: log, HopToken: "hop-token-of-thirty-two-bytes-xx"})
	return f, log, disk
}

// Issue acceptance (faults): with the audit disk full, no residency denial
// and no forwarded-in request leaves unrecorded. A denial that cannot be
// recorded is answered 503 audit_unavailable, not 451 (every 451 has its
// record); a forwarded-in request is not served. Error bodies never name
// the server's files, and /readyz says the audit log is not writable.
func TestAuditDiskFull(t *testing.T) {
	f, log, disk := auditFixture(t)
	embargoed := []string{HeaderTenant, "embargoed-1", HeaderDataClass, "public"}
	hop := []string{HeaderHop, "us-east-1", HeaderHopAuth, "hop-token-of-thirty-two-bytes-xx", HeaderTenant, "eu-health", HeaderDataClass, "phi"}

	resp, b := post(t, f.url+"/v1/chat/completions", chatBody, embargoed...)
	if resp.StatusCode != http.StatusUnavailableForLegalReasons {
		t.Fatalf("denial with a writable disk: %d %s", resp.StatusCode, b)
	}
	if resp, b = post(t, f.url+"/v1/chat/completions", chatBody, hop...); resp.StatusCode != 200 {
		t.Fatalf("forwarded-in with a writable disk: %d %s", resp.StatusCode, b)
	}
	recorded := log.Checkpoint().LastSeq
	if recorded != 2 {
		t.Fatalf("%d records, want the denial and the forwarded-in request", recorded)
	}

	disk.full.Store(true)
	calls := f.pods[0].calls.Load()
	for _, hdr := range [][]string{embargoed, hop} {
		resp, b = post(t, f.url+"/v1/chat/completions", chatBody, hdr...)
		var e apiError
		_ = json.Unmarshal(b, &e)
		if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Code != "audit_unavailable" || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("audit disk full, %v: %d %s", hdr, resp.StatusCode, b)
		}
		if strings.Contains(string(b), "/") || strings.Contains(string(b), "no space") {
			t.Fatalf("the answer names the server's files or the cause: %s", b)
		}
	}
	if got := f.pods[0].calls.Load(); got != calls {
		t.Fatal("a forwarded-in request was served without its record")
	}
	if got := testutil.ToFloat64(f.srv.m.residencyDenials.WithLabelValues("embargoed-tenants")); got != 1 {
		t.Fatalf("%v denials counted, want only the recorded one", got)
	}
	_, b = get(t, f.url+"/readyz")
	if !strings.Contains(string(b), `"writable":false`) || strings.Contains(string(b), "/tmp") {
		t.Fatalf("readyz with the audit disk full: %s", b)
	}

	// The disk has room again: denials are recorded and answered 451.
	disk.full.Store(false)
	deadline := 0
	for {
		resp, b = post(t, f.url+"/v1/chat/completions", chatBody, embargoed...)
		if resp.StatusCode == http.StatusUnavailableForLegalReasons {
			break
		}
		if deadline++; deadline > 50 {
			t.Fatalf("the audit log did not recover: %d %s", resp.StatusCode, b)
		}
	}
	_, b = get(t, f.url+"/readyz")
	if !strings.Contains(string(b), `"writable":true`) {
		t.Fatalf("readyz after the disk has room: %s", b)
	}
}
