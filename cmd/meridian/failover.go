package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/global"
)

// failoverCommand builds "meridian failover": trigger, recover and status of
// region failover through any controller's admin API.
func failoverCommand() *cli.Command {
	return &cli.Command{
		Name:  "failover",
		Usage: "fail a region over, bring it back, and show region states (via any controller's admin API)",
		Subcommands: []*cli.Command{
			{
				Name:  "trigger",
				Usage: "stop routing to a region (failed, or draining with --drain); requests go to allowed healthy regions",
				Flags: append(globalAdminFlags(),
					&cli.StringFlag{Name: "region", Usage: "the region to fail over (required)"},
					&cli.StringFlag{Name: "reason", Usage: "why, recorded with the change"},
					&cli.BoolFlag{Name: "drain", Usage: "drain instead of fail: no new requests, those in flight finish"},
					&cli.BoolFlag{Name: "force", Usage: "accept a region the cluster does not know yet, or a failover that leaves some tenants' traffic with no region the residency policy allows (the refusal names them)"},
				),
				Action: runFailoverTrigger,
			},
			{
				Name:  "recover",
				Usage: "make a region active again",
				Flags: append(globalAdminFlags(),
					&cli.StringFlag{Name: "region", Usage: "the region to recover (required)"},
					&cli.StringFlag{Name: "reason", Usage: "why, recorded with the change"},
					&cli.BoolFlag{Name: "force", Usage: "accept a region the cluster does not know yet"},
				),
				Action: runFailoverRecover,
			},
			{
				Name:   "status",
				Usage:  "show every known region's state, who set it, when and why",
				Flags:  append(globalAdminFlags(), consistentFlag()),
				Action: runFailoverStatus,
			},
		},
	}
}

// globalAdminFlags are the flags of every command that talks to the global
// tier's admin API.
func globalAdminFlags() []cli.Flag {
	return append(adminConnFlags(),
		&cli.StringFlag{Name: "actor", Usage: "who is acting, recorded with changes (default operator:$USER)"},
		&cli.BoolFlag{Name: "json", Usage: "print the answer as JSON"},
	)
}

// adminConnFlags say how to reach the global tier's admin API: the URL, the
// token, a bound on the call and the TLS options; globalClient reads them.
func adminConnFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "admin", EnvVars: []string{"MERIDIAN_ADMIN"}, Usage: "admin API base `URL` of any controller, e.g. https://10.0.0.5:8081"},
		&cli.StringFlag{Name: "token", EnvVars: []string{"MERIDIAN_ADMIN_TOKEN"}, Usage: "admin bearer token"},
		&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "give up after this long"},
	}, tlsClientFlags()...)
}

// consistentFlag is --consistent of the commands that read the global
// tier's state; readOptions passes it on to the client.
func consistentFlag() cli.Flag {
	return &cli.BoolFlag{Name: "consistent", Usage: "read on the leader (linearizable) instead of the answering controller's local state"}
}

func readOptions(c *cli.Context) global.ReadOptions {
	return global.ReadOptions{Consistent: c.Bool("consistent")}
}

// globalClient builds the admin API client from the flags, with a context
// bounded by --timeout.
func globalClient(c *cli.Context) (*global.Client, context.Context, context.CancelFunc, error) {
	admin, token, hc, err := adminTarget(c)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	return global.NewClient(admin, token, hc), ctx, cancel, nil
}

// adminTarget checks --admin and --token and builds the HTTP client of
// the TLS flags: what every command that calls a controller's admin API
// needs.
func adminTarget(c *cli.Context) (admin, token string, hc *http.Client, err error) {
	admin = strings.TrimRight(c.String("admin"), "/")
	if admin == "" {
		return "", "", nil, usageError("%s: --admin (or MERIDIAN_ADMIN) is required: the admin API URL of any controller", cmdPath(c))
	}
	if u, err := url.Parse(admin); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", "", nil, usageError("%s: --admin %q must be an http:// or https:// URL", cmdPath(c), admin)
	}
	if token = c.String("token"); token == "" {
		return "", "", nil, usageError("%s: --token (or MERIDIAN_ADMIN_TOKEN) is required", cmdPath(c))
	}
	if hc, err = tlsHTTPClient(c); err != nil {
		return "", "", nil, err
	}
	return admin, token, hc, nil
}

// cmdPath is the command's path under the app ("failover trigger").
func cmdPath(c *cli.Context) string {
	var parts []string
	for _, x := range c.Lineage() {
		if x.Command != nil && x.Command.Name != "" && (x.App == nil || x.Command.Name != x.App.Name) {
			parts = append([]string{x.Command.Name}, parts...)
		}
	}
	return strings.Join(parts, " ")
}

func globalActor(c *cli.Context) string {
	if a := c.String("actor"); a != "" {
		return a
	}
	if u := os.Getenv("USER"); u != "" {
		return "operator:" + u
	}
	return "operator"
}

// globalError names the operation and, for unreachable controllers, the URL.
func globalError(c *cli.Context, err error) error {
	var api *global.APIError
	if errors.As(err, &api) {
		return fmt.Errorf("%s: %s (%s)", cmdPath(c), api.Message, api.Code)
	}
	var uerr *url.Error
	if errors.As(err, &uerr) {
		if uerr.Timeout() || errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%s: the admin API at %s did not answer within --timeout %v (it answers a write without a Raft leader after its hold timeout; is the controller overloaded?)",
				cmdPath(c), c.String("admin"), c.Duration("timeout"))
		}
		return fmt.Errorf("%s: cannot reach the admin API at %s: %v", cmdPath(c), c.String("admin"), uerr.Err)
	}
	return fmt.Errorf("%s: %w", cmdPath(c), err)
}

func writeJSONTo(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func runFailoverTrigger(c *cli.Context) error {
	return runFailoverChange(c, true)
}

func runFailoverRecover(c *cli.Context) error {
	return runFailoverChange(c, false)
}

func runFailoverChange(c *cli.Context, trigger bool) error {
	region := c.String("region")
	if region == "" {
		return usageError("%s: --region is required", cmdPath(c))
	}
	cl, ctx, cancel, err := globalClient(c)
	if err != nil {
		return err
	}
	defer cancel()
	req := global.FailoverRequest{Region: region, Reason: c.String("reason"), Force: c.Bool("force"), Actor: globalActor(c), RequestID: global.NewRequestID()}
	var res global.Result
	if trigger {
		req.Drain = c.Bool("drain")
		res, err = cl.Trigger(ctx, req)
	} else {
		res, err = cl.Recover(ctx, req)
	}
	if err != nil {
		return globalError(c, err)
	}
	w := c.App.Writer
	if c.Bool("json") {
		return writeJSONTo(w, res)
	}
	rs := res.Region
	if rs == nil {
		return fmt.Errorf("%s: the controller answered without a region status", cmdPath(c))
	}
	if !res.Changed {
		_, err = fmt.Fprintf(w, "region %s was already %s (since %s by %s%s); nothing changed\n",
			rs.Region, rs.State, fmtTime(rs.Since), orDash(rs.Actor), reasonSuffix(rs.Reason))
		return err
	}
	_, err = fmt.Fprintf(w, "region %s is now %s (by %s%s; raft index %d)\n", rs.Region, rs.State, orDash(rs.Actor), reasonSuffix(rs.Reason), rs.Index)
	return err
}

func runFailoverStatus(c *cli.Context) error {
	cl, ctx, cancel, err := globalClient(c)
	if err != nil {
		return err
	}
	defer cancel()
	st, err := cl.FailoverStatus(ctx, readOptions(c))
	if err != nil {
		return globalError(c, err)
	}
	w := c.App.Writer
	if c.Bool("json") {
		return writeJSONTo(w, st)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tSTATE\tROUTABLE\tSINCE\tBY\tCONTROLLERS (LIVENESS)\tTARGETS\tREASON")
	for _, r := range st.Regions {
		routable := "no"
		if r.Routable {
			routable = "yes"
		}
		state := r.State.String()
		if r.Automatic {
			state += " (auto)"
		}
		ctrls := make([]string, len(r.Controllers))
		for i, id := range r.Controllers {
			ctrls[i] = id
			if l := r.Liveness[id]; l != "" {
				ctrls[i] += " (" + l + ")"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Region, state, routable, fmtTime(r.Since), orDash(r.Actor),
			orDash(strings.Join(ctrls, ", ")), orDash(strings.Join(r.Targets, ",")), orDash(r.Reason))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	h := st.Health
	leader := h.Leader
	if leader == "" {
		leader = "none known"
	}
	_, err = fmt.Fprintf(w, "\nanswered by %s (%s, %s); leader %s; state index %d\n", h.NodeID, h.Region, strings.ToLower(h.RaftState), leader, st.StateIndex)
	if err == nil && h.Stale {
		_, err = fmt.Fprintf(w, "warning: %s has not heard from a leader for %s; its state may be behind the cluster\n", h.NodeID, fmtContact(h.LastContact))
	}
	return err
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func fmtContact(d time.Duration) string {
	if d < 0 {
		return "ever"
	}
	return d.Round(time.Millisecond).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}
