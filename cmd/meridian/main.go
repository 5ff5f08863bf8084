package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"
)

// Set by the linker: -X main.version=... -X main.commit=...
var (
	version = "dev"
	commit  = "unknown"
)

// exitError carries an exit status other than 1 (for example 2 for usage).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func newApp() *cli.App {
	return &cli.App{
		Name:                 "meridian",
		Usage:                "KV-cache-aware, residency-safe traffic controller for multi-region LLM inference",
		Version:              version,
		EnableBashCompletion: true,
		HideHelpCommand:      true,
		Commands: []*cli.Command{
			versionCommand(),
			drCommand(drDrillCommand()),
			engineSimCommand(),
			eventsCommand(eventsTailCommand()),
			policyCommand(policyClusterCommands()...),
			auditCommand(),
			controllerCommand(),
			certsCommand(),
			authCommand(),
			gossipCommand(),
			kafkaDevCommand(),
			kvBridgeCommand(),
			routeCommand(),
			failoverCommand(),
			simCommand(),
			demoCommand(),
			probeCommand(),
		},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newApp().RunContext(ctx, os.Args)
	stop()
	os.Exit(exitCode(err))
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(os.Stderr, "meridian:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(os.Stderr, "meridian:", err)
	return 1
}
