package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestVersionCommand(t *testing.T) {
	app := newApp()
	var out bytes.Buffer
	app.Writer = &out
	if err := app.Run([]string{"meridian", "version"}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "meridian "+version+" (commit ") {
		t.Fatalf("version output %q", out.String())
	}
}

func TestExitCode(t *testing.T) {
	if got := exitCode(nil); got != 0 {
		t.Fatalf("exitCode(nil) = %d", got)
	}
	if got := exitCode(errors.New("boom")); got != 1 {
		t.Fatalf("exitCode(err) = %d", got)
	}
	if got := exitCode(&exitError{code: 2, err: errors.New("usage")}); got != 2 {
		t.Fatalf("exitCode(exitError 2) = %d", got)
	}
}
