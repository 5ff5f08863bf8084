package regional

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/meridian-llm/meridian/index"
	"github.com/meridian-llm/meridian/regional/tokenize"
)

// TestPromptCacheSalt: a request's cache_salt (vLLM's field) puts its chain
// in the salt's namespace, the one the re-keyer indexes salted blocks in:
// the same prompt under another salt, or none, shares no block hash.
func TestPromptCacheSalt(t *testing.T) {
	p, err := NewPrompts([]ModelConfig{{Name: "m", Tokenizer: tokenize.DefaultConfig()}}, 16, 10)
	if err != nil {
		t.Fatal(err)
	}
	chain := func(body string) *Prompt {
		var r tokenize.Request
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatal(err)
		}
		out, err := p.Encode("m", tokenize.Completion, &r, "")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	const prompt = `"prompt": [` + "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33" + `]`
	plain := chain(`{` + prompt + `}`)
	a := chain(`{` + prompt + `, "cache_salt": "tenant-a"}`)
	b := chain(`{` + prompt + `, "cache_salt": "tenant-b"}`)
	if !slices.Equal(plain.AppendIDs(nil), a.AppendIDs(nil)) || len(a.Chain) != 2 {
		t.Fatalf("the salt changed the tokens: %v %v", plain.AppendIDs(nil), a.AppendIDs(nil))
	}
	want := index.ChainHashes(index.Namespace{Model: "m", CacheSalt: "tenant-a", BlockSize: 16}, a.AppendIDs(nil), nil)
	if !slices.Equal(a.Chain, want) {
		t.Fatalf("salted chain %x, want %x", a.Chain, want)
	}
	for _, h := range a.Chain {
		if slices.Contains(plain.Chain, h) || slices.Contains(b.Chain, h) {
			t.Fatalf("a tenant-a block hash is shared with another namespace")
		}
	}
}
