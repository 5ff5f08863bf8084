package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/regional/gossip"
)

// gossipCommand is `meridian gossip`: the WAN gossip pool.
func gossipCommand() *cli.Command {
	return &cli.Command{
		Name:        "gossip",
		Usage:       "operate the WAN gossip pool (via any controller's admin API)",
		Subcommands: []*cli.Command{gossipKeysCommand()},
	}
}

func gossipKeysCommand() *cli.Command {
	keyFlags := func() []cli.Flag {
		return append(gossipAdminFlags(),
			&cli.StringFlag{Name: "key", EnvVars: []string{"MERIDIAN_GOSSIP_OP_KEY"}, Usage: "the gossip key, base64 of 32 bytes (prefer --key-file: arguments show in ps)"},
			&cli.StringFlag{Name: "key-file", Usage: "read the key from this `FILE` (- for standard input)"},
		)
	}
	return &cli.Command{
		Name:  "keys",
		Usage: "rotate the gossip encryption keys of every controller",
		Description: "A rotation is three steps, each applied by every live controller, whose answers are shown:\n" +
			"  meridian gossip keys install --key-file new.key   (every controller decrypts with it)\n" +
			"  meridian gossip keys use --key-file new.key       (every controller encrypts with it)\n" +
			"  meridian gossip keys remove --key-file old.key\n" +
			"Check with `list` that every controller has the key before `use`, and uses it before `remove`.\n" +
			"Make a key with: head -c 32 /dev/urandom | base64. Keys are never printed, only fingerprints.\n" +
			"The exit status is 1 when any controller refused or did not answer (run the step again: every\n" +
			"step is idempotent). Each step is recorded (admin_action, with the key's fingerprint and the caller's\n" +
			"certificate identity or the admin token) in the audit log of the controller asked, before it takes\n" +
			"effect; a step that cannot be recorded is refused (audit_unavailable) and changes nothing.",
		Subcommands: []*cli.Command{
			{Name: "list", Usage: "show every controller's key fingerprints", Flags: gossipAdminFlags(), Action: runGossipKeysList},
			{Name: "install", Usage: "add a key for decryption on every controller", Flags: keyFlags(), Action: runGossipKeyOp(gossip.KeyInstall)},
			{Name: "use", Usage: "make an installed key the one every controller encrypts with", Flags: keyFlags(), Action: runGossipKeyOp(gossip.KeyUse)},
			{Name: "remove", Usage: "drop a key that is no longer used from every controller", Flags: keyFlags(), Action: runGossipKeyOp(gossip.KeyRemove)},
		},
	}
}

// gossipAdminFlags are the flags of the commands that talk to the keyring
// admin API; --ca-cert, --client-cert and --client-key reach an https admin
// listener of the dev PKI (meridian certs init: ca.pem, operator.pem).
func gossipAdminFlags() []cli.Flag {
	return append(adminConnFlags(), &cli.BoolFlag{Name: "json", Usage: "print the answer as JSON"})
}

// gossipKeysClient builds the keyring API client from the flags, with a
// context bounded by --timeout.
func gossipKeysClient(c *cli.Context) (*gossip.KeysClient, context.Context, context.CancelFunc, error) {
	admin, token, hc, err := adminTarget(c)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	return &gossip.KeysClient{BaseURL: admin, Token: token, HTTP: hc}, ctx, func() { cancel(); hc.CloseIdleConnections() }, nil
}

// gossipKeysError names the operation and, for an unreachable controller,
// the URL.
func gossipKeysError(c *cli.Context, err error) error {
	var api *gossip.KeysAPIError
	if errors.As(err, &api) {
		return fmt.Errorf("%s: %s (%s)", cmdPath(c), api.Message, api.Code)
	}
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return fmt.Errorf("%s: cannot reach the admin API at %s: %v", cmdPath(c), c.String("admin"), uerr.Err)
	}
	return fmt.Errorf("%s: %w", cmdPath(c), err)
}

func readGossipKey(c *cli.Context) (string, error) {
	key, file := c.String("key"), c.String("key-file")
	switch {
	case key != "" && file != "":
		return "", usageError("%s: give --key or --key-file, not both", cmdPath(c))
	case file == "-":
		b := make([]byte, 1024)
		n, _ := c.App.Reader.Read(b)
		key = string(b[:n])
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", usageError("%s: --key-file: %w", cmdPath(c), err)
		}
		key = string(b)
	}
	key = strings.TrimSpace(key)
	if key == "" {
		return "", usageError("%s: the key is required (--key-file FILE, --key, or MERIDIAN_GOSSIP_OP_KEY)", cmdPath(c))
	}
	if _, err := gossip.KeyFingerprint(key); err != nil {
		return "", usageError("%s: %w", cmdPath(c), err)
	}
	return key, nil
}

func runGossipKeysList(c *cli.Context) error {
	cl, ctx, cancel, err := gossipKeysClient(c)
	if err != nil {
		return err
	}
	defer cancel()
	l, err := cl.List(ctx)
	if err != nil {
		return gossipKeysError(c, err)
	}
	w := c.App.Writer
	if c.Bool("json") {
		return writeJSONTo(w, l)
	}
	answered := len(l.Pool.Nodes) - l.Pool.Failed
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tINSTALLED\tPRIMARY")
	for _, k := range l.Keys {
		fmt.Fprintf(tw, "%s\t%d/%d\t%d/%d\n", k.Fingerprint, k.Installed, answered, k.Primary, answered)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if err := printKeyNodes(w, l.Pool); err != nil {
		return err
	}
	if l.Pool.Failed > 0 {
		return fmt.Errorf("%s: %d of %d controllers did not answer", cmdPath(c), l.Pool.Failed, len(l.Pool.Nodes))
	}
	return nil
}

func runGossipKeyOp(op gossip.KeyOp) cli.ActionFunc {
	return func(c *cli.Context) error {
		key, err := readGossipKey(c)
		if err != nil {
			return err
		}
		cl, ctx, cancel, err := gossipKeysClient(c)
		if err != nil {
			return err
		}
		defer cancel()
		var res gossip.KeyOpResult
		switch op {
		case gossip.KeyInstall:
			res, err = cl.Install(ctx, key)
		case gossip.KeyUse:
			res, err = cl.Use(ctx, key)
		default:
			res, err = cl.Remove(ctx, key)
		}
		var partial *gossip.KeyOpError
		if err != nil && !errors.As(err, &partial) {
			return gossipKeysError(c, err)
		}
		w := c.App.Writer
		if c.Bool("json") {
			if err := writeJSONTo(w, res); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(w, "%s %s: %d of %d controllers ok\n", op, res.Fingerprint, len(res.Nodes)-res.Failed, len(res.Nodes))
			if err := printKeyNodes(w, res); err != nil {
				return err
			}
		}
		if res.Failed > 0 {
			return fmt.Errorf("%s: %d of %d controllers failed; fix them and run it again (it is idempotent)", cmdPath(c), res.Failed, len(res.Nodes))
		}
		return nil
	}
}

// printKeyNodes prints one line per controller: outcome and fingerprints
// (the primary marked *).
func printKeyNodes(w io.Writer, res gossip.KeyOpResult) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONTROLLER\tRESULT\tKEYS")
	for _, n := range res.Nodes {
		result := "ok"
		if !n.OK {
			result = "FAILED: " + n.Error
		}
		keys := make([]string, len(n.Keys))
		for i, k := range n.Keys {
			keys[i] = k
			if i == 0 {
				keys[i] += "*"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", n.Node, result, orDash(strings.Join(keys, " ")))
	}
	return tw.Flush()
}
