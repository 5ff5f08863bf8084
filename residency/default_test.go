package residency

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestDefaultPolicyFileMatchesEmbedded keeps the embedded copy and the one
// under deploy/ equal.
func TestDefaultPolicyFileMatchesEmbedded(t *testing.T) {
	data, err := os.ReadFile("../deploy/policies/default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, DefaultPolicyBytes()) {
		t.Fatal("residency/default.yaml differs from deploy/policies/default.yaml: copy one over the other")
	}
	b := DefaultPolicyBytes()
	b[0] ^= 0xff
	if bytes.Equal(b, DefaultPolicyBytes()) {
		t.Fatal("DefaultPolicyBytes must return a copy")
	}
}

// TestDefaultPolicyStaysInOriginZone: the shipped policy keeps every request
// in its origin zone, and fails closed without a known origin.
func TestDefaultPolicyStaysInOriginZone(t *testing.T) {
	p, err := DefaultPolicy()
	if err != nil {
		t.Fatal(err)
	}
	checkEval(t, p, []evalCase{
		{"us east", Attributes{Tenant: "any", DataClass: "phi", OriginRegion: "us-east-1"}, "us-east-1 us-west-2", OutcomeDefault, "default", "", 0},
		{"us west, no tenant or class", Attributes{OriginRegion: "us-west-2"}, "us-east-1 us-west-2", OutcomeDefault, "default", "", 0},
		{"eu", Attributes{Tenant: "any", DataClass: "public", OriginRegion: "eu-west-1"}, "eu-west-1", OutcomeDefault, "default", "", 0},
		{"no origin", Attributes{Tenant: "any"}, "", OutcomeMissingAttribute, "default", "", AttrOriginRegion},
		{"unknown origin", Attributes{OriginRegion: "ap-southeast-1"}, "", OutcomeUnknownOrigin, "default", "", AttrOriginRegion},
	})
	if !strings.HasPrefix(p.ID(), "shipped-default@sha256:") {
		t.Fatalf("id %q", p.ID())
	}
}

func TestExamplePolicyIsValid(t *testing.T) {
	data, err := os.ReadFile("../deploy/policies/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if problems := Validate("example.yaml", data); problems != nil {
		t.Fatal(problems)
	}
}
