package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

// engineSimConfigFor parses args with engine-sim's flags and returns the
// configuration they make (the logger writing to errOut).
func engineSimConfigFor(t *testing.T, errOut *bytes.Buffer, args ...string) (enginesim.Config, error) {
	t.Helper()
	cmd := engineSimCommand()
	var cfg enginesim.Config
	var cfgErr error
	cmd.Action = func(c *cli.Context) error {
		cfg, cfgErr = engineSimConfig(c)
		return nil
	}
	app := &cli.App{Name: "meridian", Commands: []*cli.Command{cmd}, Writer: &bytes.Buffer{}, ErrWriter: errOut}
	if err := app.Run(append([]string{"meridian", "engine-sim"}, args...)); err != nil {
		t.Fatal(err)
	}
	return cfg, cfgErr
}

// engine-sim takes the shared logging flags: --log-level, --log-format and
// their MERIDIAN_LOG_* variables.
func TestEngineSimLogFlags(t *testing.T) {
	var out bytes.Buffer
	cfg, err := engineSimConfigFor(t, &out, "--log-level", "debug", "--log-format", "json")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger.Debug("hello", "k", "v")
	if !strings.HasPrefix(out.String(), "{") || !strings.Contains(out.String(), `"msg":"hello"`) {
		t.Fatalf("json debug log: %q", out.String())
	}

	t.Setenv("MERIDIAN_LOG_LEVEL", "warn")
	cfg, err = engineSimConfigFor(t, &out)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Logger.Enabled(context.Background(), slog.LevelInfo) || !cfg.Logger.Enabled(context.Background(), slog.LevelWarn) {
		t.Fatal("MERIDIAN_LOG_LEVEL=warn not applied")
	}

	for _, args := range [][]string{{"--log-level", "loud"}, {"--log-format", "yaml"}} {
		_, err := engineSimConfigFor(t, &out, args...)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%v: %v, want a usage error naming %s", args, err, args[0])
		}
	}
}

// engine-sim --engine picks the engine imitated; vLLM by default.
func TestEngineSimEngineFlag(t *testing.T) {
	var out bytes.Buffer
	for arg, want := range map[string]string{"": "vllm", "sglang": "sglang", "trtllm": "trtllm"} {
		args := []string{}
		if arg != "" {
			args = []string{"--engine", arg}
		}
		cfg, err := engineSimConfigFor(t, &out, args...)
		if err != nil || cfg.Engine != want || cfg.Validate() != nil {
			t.Errorf("%q: engine %q, %v", arg, cfg.Engine, err)
		}
	}
	cfg, _ := engineSimConfigFor(t, &out, "--engine", "tgi")
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "tgi") {
		t.Fatalf("an unknown engine: %v", err)
	}
}
