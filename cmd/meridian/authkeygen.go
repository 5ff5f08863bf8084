package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/regional/auth"
)

// authCommand is `meridian auth`: client credentials.
func authCommand() *cli.Command {
	return &cli.Command{
		Name:        "auth",
		Usage:       "manage client credentials (API keys)",
		Subcommands: []*cli.Command{authKeygenCommand()},
	}
}

func authKeygenCommand() *cli.Command {
	return &cli.Command{
		Name:  "keygen",
		Usage: "make a new API key and the sha256 line of its keys-file entry",
		Description: "Prints a new key (32 random bytes, base64url: give it to the client, which sends it as\n" +
			"Authorization: Bearer <key>) and the hex SHA-256 of the key text, which is all the keys file\n" +
			"holds. With --name and --tenant it prints a whole entry to paste under keys:. Keys are\n" +
			"never stored by meridian; a lost key is replaced, not recovered.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "name", Usage: "entry name (with --tenant: print a whole keys-file entry)"},
			&cli.StringFlag{Name: "tenant", Usage: "the tenant the key belongs to"},
			&cli.StringFlag{Name: "data-classes", Usage: "comma-separated data classes the key may send"},
			&cli.StringFlag{Name: "default-data-class", Usage: "data class of requests that name none (one of --data-classes)"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON: {\"key\": ..., \"sha256\": ...}"},
		},
		Action: runAuthKeygen,
	}
}

func runAuthKeygen(c *cli.Context) error {
	name, tenant := c.String("name"), c.String("tenant")
	if (name == "") != (tenant == "") {
		return usageError("auth keygen: --name and --tenant go together")
	}
	if name == "" && (c.String("data-classes") != "" || c.String("default-data-class") != "") {
		return usageError("auth keygen: --data-classes and --default-data-class need --name and --tenant")
	}
	key, digest, err := auth.GenerateKey()
	if err != nil {
		return fmt.Errorf("auth keygen: %w", err)
	}
	var entry string
	if name != "" {
		e := auth.KeyEntry{Name: name, SHA256: digest, Tenant: tenant, DataClasses: splitList(c.String("data-classes")), DefaultDataClass: c.String("default-data-class")}
		entry = keysEntryYAML(e)
		if _, err := auth.ParseKeys([]byte("keys:\n" + entry)); err != nil {
			return usageError("auth keygen: %w", err)
		}
	}
	w := c.App.Writer
	if c.Bool("json") {
		return writeJSONTo(w, map[string]string{"key": key, "sha256": digest})
	}
	fmt.Fprintf(w, "key: %s\n", key)
	fmt.Fprintf(w, "sha256: %s\n", digest)
	if entry != "" {
		fmt.Fprintf(w, "\n# keys file entry (the key itself goes to the client only):\n%s", entry)
	}
	return nil
}

// keysEntryYAML formats one entry of a keys file.
func keysEntryYAML(e auth.KeyEntry) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  - name: %s\n    sha256: %s\n    tenant: %s\n", e.Name, e.SHA256, e.Tenant)
	if len(e.DataClasses) > 0 {
		fmt.Fprintf(&b, "    data_classes: [%s]\n", strings.Join(e.DataClasses, ", "))
	}
	if e.DefaultDataClass != "" {
		fmt.Fprintf(&b, "    default_data_class: %s\n", e.DefaultDataClass)
	}
	return b.String()
}
