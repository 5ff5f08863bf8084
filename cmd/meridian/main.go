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

// exitError carries an exit status other than 1 (exitUsage, exitVerification).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }

func newApp() *cli.App {
	app := &cli.App{
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
			helpCommand(),
		},
	}
	applyGrammar(app)
	return app
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newApp().RunContext(ctx, os.Args)
	stop()
	var ee *exitError
	if err != nil && (!errors.As(err, &ee) || ee.err != nil) {
		fmt.Fprintln(os.Stderr, "meridian:", err)
	}
	os.Exit(exitCode(err))
}

// exitCode is the exit status for err (meridian help exit-codes).
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitFailed
}
