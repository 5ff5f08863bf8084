package gossip

import (
	"bytes"
	"context"
	"log"
	"log/slog"
	"strings"
)

// newStdLogger sends memberlist's log lines ("[DEBUG] memberlist: ...") to
// the slog logger at the matching level. memberlist's INFO lines are routine
// (joins, marking nodes dead), so they are logged at Debug.
func newStdLogger(l *slog.Logger) *log.Logger {
	return log.New(logWriter{l}, "", 0)
}

type logWriter struct{ l *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(bytes.TrimRight(p, "\n")))
	level := slog.LevelDebug
	for _, m := range []struct {
		prefix string
		level  slog.Level
	}{
		{"[ERR]", slog.LevelError},
		{"[ERROR]", slog.LevelError},
		{"[WARN]", slog.LevelWarn},
		{"[INFO]", slog.LevelDebug},
		{"[DEBUG]", slog.LevelDebug},
		{"[TRACE]", slog.LevelDebug - 4},
	} {
		if strings.HasPrefix(line, m.prefix) {
			level, line = m.level, strings.TrimSpace(line[len(m.prefix):])
			break
		}
	}
	if w.l.Enabled(context.Background(), level) {
		w.l.Log(context.Background(), level, line, "logger", "memberlist")
	}
	return len(p), nil
}
