package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"
)

// Exit statuses. Each has one meaning for every command; `meridian help
// exit-codes` documents them; TestExitCodesUsage runs every command to 2,
// and TestExitCodesEveryCommand shows how each one ends with 0 and 1.
const (
	exitFailed       = 1 // findings, or an operation that failed
	exitUsage        = 2 // usage or configuration error: nothing was done
	exitVerification = 3 // verification failure: tampering, a broken invariant
)

const exitCodesHelp = `Every meridian command exits with one of four statuses, each with one meaning:

  0  Success: the command did what it was asked (and, for a check, found nothing).
     An interrupted long-running command (SIGINT, SIGTERM) that stopped cleanly exits 0.

  1  Findings, or a failed operation: policy validate or policy diff found a problem,
     policy diff / diff-active --exit-code found a difference, dr check found blocking
     findings, dr drill missed a target, events decode could not decode a payload, a
     probe got no 2xx answer, a controller refused a change or could not be reached,
     a running controller, bridge or simulator stopped on an error.

  2  Usage or configuration error, and nothing was done: an unknown command or flag,
     a bad flag value, a missing or extra argument, a missing required flag, a
     configuration or policy file that does not load or validate (controller,
     kv-bridge, demo, sim), an unreadable --checkpoints or key file, an --attrs
     file that cannot be read or has a line that is not request attributes.

  3  Verification failure: audit verify found tampering (an edited, deleted,
     inserted, reordered or cut record, a missing segment), or the demo saw a broken
     invariant (a residency violation, an audit log that does not verify).

Scripts can tell "the check found something" (1) from "the check could not run as
asked" (2) from "the evidence was tampered with" (3).
`

// A sharedFlag is a flag name that more than one command uses. It means the
// same everywhere; TestFlagGrammar checks every command's flags against
// this table and `meridian help flags` prints it.
type sharedFlag struct {
	name    string
	env     string // its environment variable, if any (space-separated when each program has its own)
	meaning string
	// says is a phrase every command's usage text for the flag contains
	// (case-insensitive), so a flag that means something else is caught.
	says string
}

// sharedFlags lists them. Environment variables are the controller's where
// the controller reads the same thing (MERIDIAN_ADMIN_TOKEN, MERIDIAN_KAFKA).
func sharedFlags() []sharedFlag {
	return []sharedFlag{
		{"admin", "MERIDIAN_ADMIN", "base URL of a controller's admin API (any controller answers for the global tier)", "admin"},
		{"token", "MERIDIAN_ADMIN_TOKEN", "the admin API's bearer token (the controller's admin_token)", "admin bearer token"},
		{"controller", "MERIDIAN_CONTROLLER", "URL of a controller's API (requests, /v1/route), never its admin API", "controller"},
		{"controller-id", "MERIDIAN_CONTROLLER_ID", "a controller's id (its audit chain's name)", "controller"},
		{"ca-cert", "MERIDIAN_CA_CERT", "PEM file of the CA the controllers' certificates chain to", "CA"},
		{"client-cert", "MERIDIAN_CLIENT_CERT", "PEM file of the client certificate to present", "client certificate"},
		{"client-key", "MERIDIAN_CLIENT_KEY", "PEM file of the client certificate's key", "key"},
		{"timeout", "", "give up on the operation after this long", "give up"},
		{"json", "", "print JSON instead of text", "JSON"},
		{"actor", "", "who is acting, recorded with the change", "who is acting"},
		{"reason", "", "why, recorded with the change", "why"},
		{"force", "", "go ahead despite a refusal or blocking finding the command names", ""},
		{"consistent", "", "read on the Raft leader (linearizable)", "leader"},
		{"exit-code", "", "exit 1 when the compared things differ", "exit 1"},
		{"attrs", "", "JSON-lines file of sample request attributes (format: meridian policy diff --help)", "request attributes"},
		{"region", "", "a region name (which one the usage says)", "region"},
		{"tenant", "", "a tenant id", "tenant"},
		{"model", "", "a model name", "model"},
		{"kafka", "MERIDIAN_KAFKA", "comma-separated Kafka brokers", "Kafka brokers"},
		{"kafka-ca", "", "PEM file of the CA the brokers' certificates chain to (kafka.tls.ca)", "brokers"},
		{"kafka-cert", "", "PEM file of a client certificate for the brokers (kafka.tls.cert)", "client certificate"},
		{"kafka-key", "", "PEM file of that certificate's key (kafka.tls.key)", "key"},
		{"kafka-server-name", "", "name the brokers' certificates must be valid for", "brokers"},
		{"kafka-tls", "", "TLS to the brokers with the system's roots", "TLS to the brokers"},
		{"kafka-sasl-mechanism", "", "SASL mechanism (kafka.sasl.mechanism)", "SASL mechanism"},
		{"kafka-sasl-user", "", "SASL user name (kafka.sasl.username)", "SASL user"},
		{"kafka-sasl-password-file", "", "file holding the SASL password", "SASL password"},
		{"kafka-insecure", "", "accept plaintext to brokers beyond loopback", "plaintext"},
		{"tls-cert", "", "PEM file of the certificate the command serves TLS with", "certificate"},
		{"tls-key", "", "PEM file of that certificate's key", "key"},
		{"config", "MERIDIAN_CONFIG MERIDIAN_KVBRIDGE_CONFIG", "the program's YAML configuration file (controller, kv-bridge)", "configuration file"},
		{"check", "", "validate the configuration, print it, and exit", "validate the configuration"},
		{"dir", "", "a directory the command reads or writes (the usage says which)", "director"},
		{"hmac-key-file", "", "file holding the audit HMAC key (the controller's audit.hmac_key; MERIDIAN_AUDIT_KEY holds the key itself)", "audit HMAC key"},
		{"kind", "", "audit record kind", "kind"},
		{"key", "MERIDIAN_GOSSIP_OP_KEY", "the gossip key a keyring step acts on", "gossip key"},
		{"key-file", "", "file holding the gossip key a keyring step acts on", "key"},
		{"name", "", "name of what the command creates or runs (a pod, a key entry)", "name"},
		{"seed", "", "random seed", ""},
		{"time-scale", "", "simulated time per real time", ""},
		{"sessions", "", "concurrent client sessions", "concurrent"},
		{"session", "", "a session id", "session"},
		{"topic", "", "a Kafka topic", "topic"},
		{"duration", "", "how long the run lasts (simulated)", ""},
		{"limit", "", "at most N records or requests", "N"},
		{"drain", "", "drain the region (requests in flight finish) instead of failing it", "drain"},
		{"addr", "", "the address to listen on", "listen address"},
		{"pods-per-region", "", "simulated pods per region", "pods"},
		{"replicas", "", "controller replicas per region", "controllers per region"},
		{"cache-blocks", "", "KV-cache capacity of a simulated pod in blocks", "blocks"},
		{"max-concurrency", "", "requests a simulated pod runs at once", "running"},
		{"workers", "", "files read in parallel", "parallel"},
		{"log-level", "MERIDIAN_LOG_LEVEL", "debug, info, warn or error", "debug"},
		{"log-format", "MERIDIAN_LOG_FORMAT", "text or json", "json"},
	}
}

// helpCommand is `meridian help [COMMAND...|TOPIC]`.
func helpCommand() *cli.Command {
	topics := map[string]func(c *cli.Context) error{
		"exit-codes": func(c *cli.Context) error {
			_, err := fmt.Fprint(c.App.Writer, exitCodesHelp)
			return err
		},
		"flags": printSharedFlags,
	}
	return &cli.Command{
		Name:      "help",
		Usage:     "show help for a command, or a topic: exit-codes (what each exit status means), flags (flags shared by commands)",
		ArgsUsage: "[COMMAND [SUBCOMMAND...] | exit-codes | flags]",
		Action: func(c *cli.Context) error {
			args := c.Args().Slice()
			if len(args) == 0 {
				return cli.ShowAppHelp(c)
			}
			if topic, ok := topics[args[0]]; ok && len(args) == 1 {
				return topic(c)
			}
			cmds, path := c.App.Commands, "meridian"
			var cmd *cli.Command
			for _, a := range args {
				cmd = findCommand(cmds, a)
				if cmd == nil {
					return usageError("help: no command %q under %q (topics: exit-codes, flags)", a, path)
				}
				path += " " + cmd.Name
				cmds = cmd.Subcommands
			}
			if cmd.HelpName == "" {
				cmd.HelpName = path
			}
			tmpl := cli.CommandHelpTemplate
			if len(cmd.Subcommands) > 0 {
				tmpl = cli.SubcommandHelpTemplate
			}
			cli.HelpPrinter(c.App.Writer, tmpl, cmd)
			return nil
		},
	}
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

func printSharedFlags(c *cli.Context) error {
	fmt.Fprintln(c.App.Writer, "Flags that several commands take mean the same thing in each:")
	fmt.Fprintln(c.App.Writer)
	tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	for _, f := range sharedFlags() {
		var env []string
		for _, e := range strings.Fields(f.env) {
			env = append(env, "$"+e)
		}
		fmt.Fprintf(tw, "  --%s\t%s\t%s\n", f.name, strings.Join(env, " "), f.meaning)
	}
	return tw.Flush()
}

// applyGrammar makes every command of app follow the one grammar: a flag
// that does not parse, an unknown command, a missing subcommand and an
// argument to a command that takes none (no ArgsUsage) are usage errors
// (exit 2), whatever urfave/cli would have returned.
func applyGrammar(app *cli.App) {
	// urfave/cli adds --help to the app only with its own help command,
	// which helpCommand replaces.
	app.Flags = append(app.Flags, cli.HelpFlag)
	app.OnUsageError = onUsageError
	app.Action = groupAction(nil)
	for _, c := range app.Commands {
		applyCommandGrammar(c)
	}
}

func applyCommandGrammar(c *cli.Command) {
	c.OnUsageError = onUsageError
	switch {
	case c.Action == nil:
		c.Action = groupAction(c)
	case c.ArgsUsage == "":
		c.Action = noArgs(c.Action)
	}
	for _, s := range c.Subcommands {
		applyCommandGrammar(s)
	}
}

func onUsageError(c *cli.Context, err error, _ bool) error {
	return usageError("%s%v (see %s --help)", where(c), err, helpPath(c))
}

// groupAction runs when a command group (or the app, g == nil) is given no
// subcommand, or one it does not have.
func groupAction(g *cli.Command) cli.ActionFunc {
	return func(c *cli.Context) error {
		cmds := c.App.Commands
		if g != nil {
			cmds = g.Subcommands
		}
		var names []string
		for _, s := range cmds {
			if !s.Hidden && s.Name != "help" {
				names = append(names, s.Name)
			}
		}
		if c.NArg() == 0 {
			return usageError("%sname a command: %s (see %s --help)", where(c), strings.Join(names, ", "), helpPath(c))
		}
		return usageError("%sno command %q; the commands are %s (see %s --help)", where(c), c.Args().First(), strings.Join(names, ", "), helpPath(c))
	}
}

// noArgs refuses arguments to a command that declares none.
func noArgs(action cli.ActionFunc) cli.ActionFunc {
	return func(c *cli.Context) error {
		if c.NArg() > 0 {
			return usageError("%sunexpected arguments %q: it takes none (flags go before arguments; see %s --help)", where(c), c.Args().Slice(), helpPath(c))
		}
		return action(c)
	}
}

// where prefixes a message with the command's path ("audit verify: "); main
// prints "meridian: " before it.
func where(c *cli.Context) string {
	if p := cmdPath(c); p != "" {
		return p + ": "
	}
	return ""
}

// helpPath is "meridian" and the command's path ("meridian audit verify").
func helpPath(c *cli.Context) string {
	if p := cmdPath(c); p != "" {
		return "meridian " + p
	}
	return "meridian"
}
