package fleet

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/regional"
)

// syncBuffer is a bytes.Buffer many goroutines' handlers write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}

// duplicateKeys returns the keys that occur twice in one JSON object of
// line (a nested object's keys are its own: "a.b" names them).
func duplicateKeys(line []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	var dups []string
	var object func(path string) error
	var value func(path string) error
	value = func(path string) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			return object(path)
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if err := value(fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
			_, err := dec.Token() // ]
			return err
		}
		return nil
	}
	object = func(path string) error {
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := tok.(string)
			if path != "" {
				key = path + "." + key
			}
			if seen[key] {
				dups = append(dups, key)
			}
			seen[key] = true
			if err := value(key); err != nil {
				return err
			}
		}
		_, err := dec.Token() // }
		return err
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object (%v)", err)
	}
	if err := object(""); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("trailing data after the object")
	}
	return dups, nil
}

func TestDuplicateKeys(t *testing.T) {
	for line, want := range map[string]string{
		`{"a":1,"b":2}`:                     "",
		`{"a":1,"a":2}`:                     "a",
		`{"a":{"x":1,"x":2},"b":[{"y":1}]}`: "a.x",
		`{"a":{"x":1},"x":{"a":1}}`:         "",
		`{"l":[1,{"k":1,"k":2}]}`:           "l[1].k",
	} {
		got, err := duplicateKeys([]byte(line))
		if err != nil || strings.Join(got, ",") != want {
			t.Errorf("duplicateKeys(%s) = %v, %v; want %q", line, got, err, want)
		}
	}
	if _, err := duplicateKeys([]byte(`{"a":1} x`)); err == nil {
		t.Error("trailing data accepted")
	}
}

// TestLogsHaveNoDuplicateKeys runs a fleet with JSON logs at debug level
// through requests served locally, forwarded to another region and
// refused, a failover and a recovery, and its shutdown; every line it logs
// (the controllers', Raft's, memberlist's, Kafka's) must be one JSON object
// without a key twice: log tools keep one of them, so the other's meaning
// (the controller's own region, say, against the one the line is about)
// is lost.
func TestLogsHaveNoDuplicateKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region")
	}
	var out syncBuffer
	log := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f, err := Start(ctx, Config{Dir: t.TempDir(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	us := f.Region("us-east-1").Controller.URL()
	for _, h := range []map[string]string{
		{regional.HeaderTenant: "acme", regional.HeaderDataClass: "public"},
		{regional.HeaderTenant: "eu-health", regional.HeaderDataClass: "phi"},
		{regional.HeaderTenant: "embargoed-x", regional.HeaderDataClass: "public"},
	} {
		ask(t, f.HTTP, us, "/v1/chat/completions", h, "hello")
	}
	c := global.NewClient(f.Region("eu-west-1").Controller.AdminURL(), f.AdminToken, f.HTTP)
	if _, err := c.Trigger(ctx, global.FailoverRequest{Region: "us-west-2", Reason: "log test"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "us-west-2 failed everywhere", func() bool { return f.nowhereRoutable("us-west-2") })
	if _, err := c.Recover(ctx, global.FailoverRequest{Region: "us-west-2", Reason: "log test"}); err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	if err := f.Close(cctx); err != nil {
		t.Fatal(err)
	}

	lines, bad := 0, map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out.Bytes()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines++
		dups, err := duplicateKeys(sc.Bytes())
		if err != nil {
			t.Errorf("log line %d is not one JSON object: %v\n%s", lines, err, sc.Text())
			continue
		}
		for _, k := range dups {
			if len(bad[k]) < 3 {
				bad[k] = append(bad[k], sc.Text())
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(bad))
	for k := range bad {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Errorf("key %q twice in a log line, e.g.:\n  %s", k, strings.Join(bad[k], "\n  "))
	}
	if lines < 100 {
		t.Errorf("only %d log lines: is the logger wired?", lines)
	}
	t.Logf("%d log lines checked", lines)
}
