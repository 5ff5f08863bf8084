package regional

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/regional/kvevents"
)

type logLine struct {
	Level      string `json:"level"`
	Msg        string `json:"msg"`
	Logger     string `json:"logger"`
	Suppressed int    `json:"suppressed_since_last"`
}

func parseLines(t *testing.T, b []byte) []logLine {
	t.Helper()
	var out []logLine
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var x logLine
		if err := json.Unmarshal(l, &x); err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		out = append(out, x)
	}
	return out
}

// A library's repeated warning passes once per interval, with the count of
// those suppressed; the controller's own lines and a library's debug lines
// all pass.
func TestLibraryNoiseLimitsLibraryWarnings(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	log := slog.New(newLibraryNoise(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}), time.Minute, clock)).
		With("region", "us-east-1")
	for range 5 {
		log.Warn("memberlist: Failed fallback ping: EOF", "logger", "memberlist")
		log.Error("failed to heartbeat to", "logger", "raft")
		log.Debug("memberlist: Stream connection", "logger", "memberlist")
		log.Warn("kafka consumer failed; reconnecting") // ours
	}
	now = now.Add(time.Minute)
	log.Warn("memberlist: Failed fallback ping: EOF", "logger", "memberlist")

	count := map[string]int{}
	for _, l := range parseLines(t, buf.Bytes()) {
		count[l.Level+" "+l.Logger+" "+l.Msg]++
		if l.Suppressed != 0 && (l.Logger != "memberlist" || l.Suppressed != 4) {
			t.Errorf("suppressed_since_last %d on %+v", l.Suppressed, l)
		}
	}
	for line, want := range map[string]int{
		"WARN memberlist memberlist: Failed fallback ping: EOF": 2, // then 1 a minute later, with 4 suppressed
		"ERROR raft failed to heartbeat to":                     1,
		"DEBUG memberlist memberlist: Stream connection":        5,
		"WARN  kafka consumer failed; reconnecting":             5,
	} {
		if count[line] != want {
			t.Errorf("%q logged %d times, want %d (all: %v)", line, count[line], want, count)
		}
	}
}

// kafka-go's i/o timeouts on idle fetches go to Debug; its other errors are
// warnings, at most one a minute.
func TestKafkaErrorLogger(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l := kafkaErrorLogger(kvevents.NewWarnLimiter(log, time.Minute, func() time.Time { return now }), log)
	for i := range 3 {
		l.Printf("the kafka reader got an unknown error reading partition %d of %s at offset %d: %s", 0, "t", i, "read tcp 127.0.0.1:1->127.0.0.1:9092: i/o timeout")
		l.Printf("failed to read from current broker for partition %d of %s at offset %d: %v", 0, "t", i, "[6] Not Leader For Partition")
	}
	var debug, warn int
	for _, x := range parseLines(t, buf.Bytes()) {
		switch {
		case x.Level == "DEBUG" && strings.Contains(x.Msg, "i/o timeout") && x.Logger == "kafka-go":
			debug++
		case x.Level == "WARN" && strings.Contains(x.Msg, "Not Leader") && x.Logger == "kafka-go":
			warn++
		default:
			t.Errorf("unexpected line %+v", x)
		}
	}
	if debug != 3 || warn != 1 {
		t.Errorf("%d debug i/o timeouts (want 3), %d warnings (want 1)", debug, warn)
	}
}
