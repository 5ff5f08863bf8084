package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

func TestHTTPQueryMatchesLocal(t *testing.T) {
	root := t.TempDir()
	a := openTest(t, testConfig(root, "a"), Deps{})
	b := openTest(t, testConfig(root, "b"), Deps{})
	for i := range 20 {
		mustAppend(t, []*Log{a, b}[i%2], testEntry(i))
	}
	sa := httptest.NewServer(Handler(a))
	defer sa.Close()
	sb := httptest.NewServer(Handler(b))
	defer sb.Close()
	fanout := Multi{&HTTPSource{BaseURL: sa.URL}, &HTTPSource{BaseURL: sb.URL + "/"}}
	queries := []Query{
		{},
		{Region: "eu-west-1"},
		{Tenant: "tenant-2"},
		{Kinds: []Kind{KindResidencyDenied}, Limit: 3},
		{Controller: "b", Tenant: "tenant-1"},
	}
	for _, q := range queries {
		want, err := NaiveQuery(root, q, a.Hasher())
		if err != nil {
			t.Fatal(err)
		}
		cur, err := fanout.Query(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Collect(cur)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(keys(got), keys(want)) || len(want) == 0 {
			t.Fatalf("query %+v over http:\n got %v\nwant %v", q, keys(got), keys(want))
		}
		// What travels is the canonical record: it still verifies.
		for _, r := range got {
			line, _ := r.AppendCanonical(nil)
			if c, _ := checkLine(line, nil); !c.hashOK {
				t.Fatalf("record over http does not verify: %s", c.problem)
			}
		}
	}
}

func TestHTTPBadRequest(t *testing.T) {
	l := openTest(t, testConfig(t.TempDir(), "a"), Deps{})
	srv := httptest.NewServer(Handler(l))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/query?from=yesterday")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `"error":"audit query: from \"yesterday\"`) {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	_, err = (&HTTPSource{BaseURL: srv.URL}).Query(context.Background(), Query{Kinds: []Kind{"x"}, From: testStart, To: testStart})
	if err == nil {
		t.Fatal("invalid query sent")
	}
	// A source without the key refuses tenant queries with a 400 naming why.
	dirSrv := httptest.NewServer(Handler(&DirSource{Dir: l.Dir()}))
	defer dirSrv.Close()
	_, err = (&HTTPSource{BaseURL: dirSrv.URL}).Query(context.Background(), Query{Tenant: "acme"})
	if err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), ErrNoKey.Error()) {
		t.Fatalf("tenant query without key over http: %v", err)
	}
}

func TestHTTPTailAndMultiTail(t *testing.T) {
	root := t.TempDir()
	a := openTest(t, testConfig(root, "a"), Deps{})
	b := openTest(t, testConfig(root, "b"), Deps{})
	srv := httptest.NewServer(Handler(a))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cur, err := Multi{&HTTPSource{BaseURL: srv.URL}, b}.Tail(ctx, Query{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		mustAppend(t, []*Log{a, b}[i%2], testEntry(i))
	}
	var got []string
	for range 6 {
		r, err := cur.Next()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s#%d", r.Controller, r.Seq))
	}
	slices.Sort(got)
	if want := []string{"a#1", "a#2", "a#3", "b#1", "b#2", "b#3"}; !slices.Equal(got, want) {
		t.Fatalf("multi tail %v", got)
	}
	cancel()
	if _, err := cur.Next(); !errors.Is(err, context.Canceled) {
		t.Fatalf("after cancel: %v", err)
	}
	cur.Close() // waits for its goroutines (goleak checks)
}
