package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/global/identity"
)

// certsCommand is `meridian certs`: the development PKI.
func certsCommand() *cli.Command {
	return &cli.Command{
		Name:        "certs",
		Usage:       "make TLS certificates for controllers and the operator CLI",
		Subcommands: []*cli.Command{certsInitCommand()},
	}
}

func certsInitCommand() *cli.Command {
	return &cli.Command{
		Name:  "init",
		Usage: "write a development CA, one certificate per controller and an operator certificate",
		Description: "Writes DIR/ca.pem and DIR/ca-key.pem, DIR/<id>.pem and DIR/<id>-key.pem for each controller\n" +
			"(id ctl-<region>, or ctl-<region>-<n> with --replicas above 1; usable as server and client),\n" +
			"and DIR/operator.pem with its key (client only). Keys are ECDSA P-256, mode 0600. A controller\n" +
			"certificate names its id as CommonName and spiffe://meridian/region/<region>/controller/<id>\n" +
			"as URI SAN, and is valid for localhost, <id>, ctl-<region>, 127.0.0.1, ::1 and --hosts.\n" +
			"An existing CA is never replaced without --force. For development and tests: keep the CA\n" +
			"key of a real deployment offline, or use your own CA (cert-manager in deploy/k8s).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "dir", Usage: "directory to write to (created if missing; required)"},
			&cli.StringFlag{Name: "regions", Usage: "comma-separated `REGIONS` to issue controller certificates for (required)"},
			&cli.IntFlag{Name: "replicas", Value: 1, Usage: "controllers per region"},
			&cli.StringFlag{Name: "hosts", Usage: "comma-separated extra DNS names or IP addresses for every controller certificate"},
			&cli.StringFlag{Name: "operator", Value: "operator", Usage: "name of the client-only certificate"},
			&cli.DurationFlag{Name: "validity", Value: 365 * 24 * time.Hour, Usage: "validity of the controller and operator certificates"},
			&cli.BoolFlag{Name: "force", Usage: "replace an existing CA and every certificate in DIR"},
		},
		Action: runCertsInit,
	}
}

func runCertsInit(c *cli.Context) error {
	dir := c.String("dir")
	if dir == "" {
		return usageError("certs init: --dir is required")
	}
	regions := splitList(c.String("regions"))
	if len(regions) == 0 {
		return usageError("certs init: --regions is required (e.g. --regions us-east-1,eu-west-1)")
	}
	if c.Duration("validity") <= 0 {
		return usageError("certs init: --validity %v: want > 0", c.Duration("validity"))
	}
	res, err := identity.InitDevPKI(dir, regions, identity.PKIOptions{
		ReplicasPerRegion: c.Int("replicas"),
		Hosts:             splitList(c.String("hosts")),
		Operator:          c.String("operator"),
		Force:             c.Bool("force"),
		Validity:          c.Duration("validity"),
	})
	switch {
	case errors.Is(err, identity.ErrInvalidPKIInput):
		return usageError("certs init: %w", err)
	case err != nil:
		return fmt.Errorf("certs init: %w", err)
	}
	w := c.App.Writer
	fmt.Fprintf(w, "ca=%s\n", res.CACert)
	fmt.Fprintf(w, "ca-key=%s (mode 0600; keep it offline)\n", res.CAKey)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IDENTITY\tCERT\tKEY")
	for _, ic := range append(res.Controllers, res.Operator) {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", ic.Identity, ic.Cert, ic.Key)
	}
	return tw.Flush()
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
