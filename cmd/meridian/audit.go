package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/audit"
)

// auditCommand builds "meridian audit"; extra subcommands are appended.
func auditCommand(extra ...*cli.Command) *cli.Command {
	return &cli.Command{
		Name:  "audit",
		Usage: "query, follow and verify the hash-chained audit log of cross-region decisions and privileged actions",
		Subcommands: append([]*cli.Command{
			auditQueryCommand(), auditTailCommand(), auditVerifyCommand(), auditHashCommand(), auditCheckpointsCommand(),
		}, extra...),
	}
}

// auditSourceFlags select where records are read from: a directory, or the
// admin APIs of controllers (fanned out, merged in time order).
func auditSourceFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "dir", Usage: "audit directory: a root with one directory per controller, or one controller's directory"},
		&cli.StringSliceFlag{Name: "admin", EnvVars: []string{"MERIDIAN_ADMIN"}, Usage: "admin API `URL`s of the controllers to ask instead of --dir (repeat or comma-separate); records are merged in time order"},
		&cli.StringFlag{Name: "token", EnvVars: []string{"MERIDIAN_ADMIN_TOKEN"}, Usage: "admin bearer token for --admin"},
		hmacKeyFileFlag("needed for --tenant"),
	}, tlsClientFlags()...)
}

// hmacKeyFileFlag is --hmac-key-file; without it the key is taken from
// MERIDIAN_AUDIT_KEY, as the controller takes it (auditHasher).
func hmacKeyFileFlag(why string) cli.Flag {
	return &cli.StringFlag{Name: "hmac-key-file", Usage: "`FILE` holding the audit HMAC key as the controller's audit.hmac_key is written (default: $MERIDIAN_AUDIT_KEY, the key itself, as the controller reads it); " + why}
}

func auditFilterFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "region", Usage: "records whose origin or chosen region is `REGION`"},
		&cli.StringFlag{Name: "tenant", Usage: "records of raw tenant id `ID` (compared by its HMAC)"},
		&cli.StringSliceFlag{Name: "kind", Usage: "record kind (cross_region, residency_denied, forwarded_in, fallback, or admin_action: policy applies, failovers, membership changes, key rotation); repeat or comma-separate"},
		&cli.StringFlag{Name: "controller-id", Usage: "only the chain of controller `ID`"},
		&cli.BoolFlag{Name: "json", Usage: "print each record as its canonical JSON line"},
	}
}

// auditDir returns --dir, which must name a directory.
func auditDir(c *cli.Context) (string, error) {
	dir := c.String("dir")
	if dir == "" {
		return "", usageError("audit %s: --dir is required", c.Command.Name)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", usageError("--dir %q is not a directory", dir)
	}
	return dir, nil
}

func auditSource(c *cli.Context) (audit.Source, error) {
	if urls := c.StringSlice("admin"); len(urls) > 0 {
		if c.String("dir") != "" {
			return nil, usageError("audit %s: give --dir or --admin, not both", c.Command.Name)
		}
		hc, err := tlsHTTPClient(c)
		if err != nil {
			return nil, err
		}
		var m audit.Multi
		for _, u := range urls {
			for _, one := range strings.Split(u, ",") {
				if one = strings.TrimSpace(one); one != "" {
					m = append(m, &audit.HTTPSource{BaseURL: strings.TrimRight(one, "/") + "/v1/audit", Token: c.String("token"), Client: hc})
				}
			}
		}
		return m, nil
	}
	dir, err := auditDir(c)
	if err != nil {
		return nil, err
	}
	src := &audit.DirSource{Dir: dir, PollInterval: c.Duration("poll")}
	h, err := auditHasher(c)
	if err != nil {
		return nil, err
	}
	src.Hasher = h
	return src, nil
}

// auditKeyEnv holds the audit HMAC key itself: the variable the controller
// reads it from (regional.Config.ApplyEnv).
const auditKeyEnv = "MERIDIAN_AUDIT_KEY"

// auditHasher is the audit HMAC key from --hmac-key-file (its bytes, without
// a trailing newline) or else from MERIDIAN_AUDIT_KEY, decoded as the
// controller decodes it; nil when neither is given.
func auditHasher(c *cli.Context) (*audit.Hasher, error) {
	src, raw := auditKeyEnv, os.Getenv(auditKeyEnv)
	if path := c.String("hmac-key-file"); path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, usageError("--hmac-key-file: %v", err)
		}
		src, raw = "--hmac-key-file "+path, string(bytes.TrimRight(b, "\r\n"))
	}
	if raw == "" {
		return nil, nil
	}
	key, err := audit.DecodeKey(raw)
	if err != nil {
		return nil, usageError("%s: %v", src, err)
	}
	h, err := audit.NewHasher(key)
	if err != nil {
		return nil, usageError("%s: %v", src, err)
	}
	return h, nil
}

// auditQuery builds the query from the filter flags (and --from, --to,
// --limit where the command has them).
func auditQuery(c *cli.Context) (audit.Query, error) {
	q := audit.Query{Region: c.String("region"), Tenant: c.String("tenant"), Controller: c.String("controller-id"), Limit: c.Int("limit")}
	now := time.Now()
	for _, f := range []struct {
		name string
		dst  *time.Time
	}{{"from", &q.From}, {"to", &q.To}} {
		if s := c.String(f.name); s != "" {
			t, err := audit.ParseTimeFlag(s, now)
			if err != nil {
				return q, usageError("--%s: %v", f.name, err)
			}
			*f.dst = t
		}
	}
	for _, k := range c.StringSlice("kind") {
		q.Kinds = append(q.Kinds, audit.Kind(k))
	}
	if err := q.Validate(); err != nil {
		return q, usageError("%v", err)
	}
	if q.Tenant != "" && c.String("hmac-key-file") == "" && os.Getenv(auditKeyEnv) == "" {
		return q, usageError("--tenant needs the audit HMAC key: pass --hmac-key-file (or set %s)", auditKeyEnv)
	}
	return q, nil
}

func auditQueryCommand() *cli.Command {
	return &cli.Command{
		Name:  "query",
		Usage: "print the records of a time range, region, tenant or decision kind",
		Description: "Times are RFC 3339, a date (YYYY-MM-DD, UTC) or a duration ago (90m). --from is inclusive, --to exclusive.\n" +
			"Records come in time order across controllers. Exit status: 0, 1 on error, 2 on a usage error.",
		Flags: append(append(auditSourceFlags(), auditFilterFlags()...),
			&cli.StringFlag{Name: "from", Usage: "first `TIME` (inclusive)"},
			&cli.StringFlag{Name: "to", Usage: "end `TIME` (exclusive)"},
			&cli.IntFlag{Name: "limit", Usage: "at most `N` records"},
		),
		Action: func(c *cli.Context) error {
			q, err := auditQuery(c)
			if err != nil {
				return err
			}
			src, err := auditSource(c)
			if err != nil {
				return err
			}
			n, err := audit.WriteQuery(c.Context, src, q, c.App.Writer, c.Bool("json"))
			if err != nil {
				return fmt.Errorf("audit query: %w", err)
			}
			if !c.Bool("json") {
				fmt.Fprintf(c.App.ErrWriter, "%d records\n", n)
			}
			return nil
		},
	}
}

func auditTailCommand() *cli.Command {
	return &cli.Command{
		Name:  "tail",
		Usage: "follow new records as controllers write them (until interrupted)",
		Flags: append(append(auditSourceFlags(), auditFilterFlags()...),
			&cli.DurationFlag{Name: "poll", Value: 500 * time.Millisecond, Usage: "how often to look for new records"},
		),
		Action: func(c *cli.Context) error {
			if c.Duration("poll") <= 0 {
				return usageError("--poll %s must be positive", c.Duration("poll"))
			}
			q, err := auditQuery(c)
			if err != nil {
				return err
			}
			src, err := auditSource(c)
			if err != nil {
				return err
			}
			if err := audit.WriteTail(c.Context, src, q, c.App.Writer, c.Bool("json")); err != nil {
				return fmt.Errorf("audit tail: %w", err)
			}
			return nil
		},
	}
}

func auditVerifyCommand() *cli.Command {
	return &cli.Command{
		Name:  "verify",
		Usage: "recompute every chain and check it against the checkpoints",
		Description: "Reports each edited, deleted, inserted, reordered or truncated record and each missing or\n" +
			"swapped segment with its file and line. Without --checkpoints, a cut tail or a chain rewritten\n" +
			"to its end cannot be detected. Exit status: 0 when intact, 3 when problems are found,\n" +
			"1 when the log cannot be read, 2 on a usage error.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "dir", Usage: "audit directory: a root with one directory per controller, or one controller's directory"},
			&cli.StringFlag{Name: "checkpoints", Usage: "`FILE` of checkpoints as JSON lines (meridian audit checkpoints export writes it)"},
			&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
		}, adminConnFlags()...),
		Action: func(c *cli.Context) error {
			dir, err := auditDir(c)
			if err != nil {
				return err
			}
			var cps []audit.Checkpoint
			switch path, admin := c.String("checkpoints"), c.String("admin"); {
			case path != "" && admin != "":
				return usageError("audit verify: give --checkpoints or --admin, not both")
			case admin != "":
				cl, ctx, cancel, err := globalClient(c)
				if err != nil {
					return err
				}
				l, err := cl.Checkpoints(ctx, "", global.ReadOptions{Consistent: true})
				cancel()
				if err != nil {
					return globalError(c, fmt.Errorf("checkpoints from %s: %w", admin, err))
				}
				cps = raftCheckpoints(l)
			case path != "":
				if cps, err = audit.ReadCheckpointsFile(path); err != nil {
					return usageError("--checkpoints: %v", err)
				}
			default:
				fmt.Fprintln(c.App.ErrWriter, "warning: no --checkpoints: a cut tail or a chain rewritten to its end cannot be detected")
			}
			rep, err := audit.Verify(dir, cps)
			if err != nil {
				return fmt.Errorf("audit verify: %w", err)
			}
			if len(rep.Chains) == 0 {
				return fmt.Errorf("audit verify: no audit segments under %s (expected DIR/<controller>/*.jsonl or DIR/*.jsonl)", dir)
			}
			if c.Bool("json") {
				err = rep.WriteJSON(c.App.Writer)
			} else {
				err = rep.WriteText(c.App.Writer)
			}
			if err != nil {
				return err
			}
			if !rep.OK() {
				return &exitError{code: exitVerification, err: fmt.Errorf("audit verify: %d problems in %s", len(rep.Problems), dir)}
			}
			return nil
		},
	}
}

func auditHashCommand() *cli.Command {
	return &cli.Command{
		Name:  "hash",
		Usage: "print the HMAC stored for a tenant or session id (to search the files with other tools)",
		Flags: []cli.Flag{
			hmacKeyFileFlag("the key the controllers hash with"),
			&cli.StringFlag{Name: "tenant", Usage: "raw tenant id"},
			&cli.StringFlag{Name: "session", Usage: "raw session id"},
		},
		Action: func(c *cli.Context) error {
			tenant, session := c.String("tenant"), c.String("session")
			if (tenant == "") == (session == "") {
				return usageError("audit hash: give exactly one of --tenant and --session")
			}
			h, err := auditHasher(c)
			if err != nil {
				return err
			}
			if h == nil {
				return usageError("audit hash: the audit HMAC key is required: pass --hmac-key-file (or set %s)", auditKeyEnv)
			}
			out := h.Tenant(tenant)
			if session != "" {
				out = h.Session(session)
			}
			_, err = fmt.Fprintf(c.App.Writer, "%s\tkid=%s\n", out, h.KeyID())
			return err
		},
	}
}
