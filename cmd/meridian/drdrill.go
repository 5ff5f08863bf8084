package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/dr/drill"
)

// drDrillCommand builds "meridian dr drill": a rehearsed, timed failover of
// one region on a running cluster.
func drDrillCommand() *cli.Command {
	def := drill.DefaultConfig()
	return &cli.Command{
		Name:  "drill",
		Usage: "fail a region over on a running cluster, time how long traffic takes to move and to come back, and check residency held",
		Description: "Records the baseline of probe traffic from every origin, fails (or drains) --region through the admin API,\n" +
			"probes until every probe the residency policy allows elsewhere is served elsewhere (and those it allows only there\n" +
			"are refused with 503 residency_no_healthy_region), recovers the region and probes until traffic is back. The region\n" +
			"is recovered whatever happens once it was failed, Ctrl-C included.\n\n" +
			"Exit status: 0 when the drill passes; 1 when a target is missed, a request was served outside its residency zone,\n" +
			"or the drill could not run; 2 for usage errors.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "admin", EnvVars: []string{"MERIDIAN_ADMIN"}, Usage: "admin API base `URL` of any controller (required)"},
			&cli.StringFlag{Name: "token", EnvVars: []string{"MERIDIAN_ADMIN_TOKEN"}, Usage: "admin bearer token (required)"},
			&cli.StringSliceFlag{Name: "controller", Usage: "`REGION=URL` of a region's controller public API; repeat for every region to probe from (required)"},
			&cli.StringFlag{Name: "region", Usage: "the region to fail over and recover (required)"},
			&cli.BoolFlag{Name: "drain", Usage: "drain the region (requests in flight finish) instead of failing it"},
			&cli.BoolFlag{Name: "force", Usage: "fail the region over even when that leaves some traffic with no region the residency policy allows"},
			&cli.StringSliceFlag{Name: "probe", Usage: "extra probe `ORIGIN:TENANT:CLASS` (repeat); by default every origin sends " + drill.ProbeTenant + " public and pii and eu-health phi"},
			&cli.BoolFlag{Name: "no-default-probes", Usage: "send only the --probe probes"},
			&cli.StringFlag{Name: "model", Value: def.Model, Usage: "model named in probe requests"},
			&cli.DurationFlag{Name: "interval", Value: def.Interval, Usage: "time between two requests of one probe"},
			&cli.DurationFlag{Name: "probe-timeout", Value: def.ProbeTimeout, Usage: "bound on one probe request"},
			&cli.DurationFlag{Name: "target-moved", Value: def.TargetMoved, Usage: "traffic must have moved this soon after the trigger returned"},
			&cli.DurationFlag{Name: "target-back", Value: def.TargetBack, Usage: "traffic must be back this soon after the recovery returned"},
			&cli.DurationFlag{Name: "hold", Value: def.Hold, Usage: "how long traffic must stay moved (back) before the drill goes on"},
			&cli.DurationFlag{Name: "moved-timeout", Value: def.MovedTimeout, Usage: "recover anyway when traffic has not moved this long after the trigger"},
			&cli.DurationFlag{Name: "back-timeout", Value: def.BackTimeout, Usage: "stop waiting for traffic to come back after this long"},
			&cli.DurationFlag{Name: "admin-timeout", Value: def.AdminTimeout, Usage: "bound on each admin API call"},
			&cli.IntFlag{Name: "max-errors", Value: def.MaxErrors, Usage: "fail when more probe requests than this fail (negative: count errors, do not judge them)"},
			&cli.StringFlag{Name: "reason", Value: def.Reason, Usage: "why, recorded with the failover and the recovery"},
			&cli.StringFlag{Name: "actor", Usage: "who is acting, recorded with the changes (default operator:$USER)"},
			&cli.StringFlag{Name: "report-md", Usage: "write the Markdown report to `FILE`"},
			&cli.StringFlag{Name: "report-json", Usage: "write the JSON report to `FILE`"},
			&cli.BoolFlag{Name: "json", Usage: "print the JSON report instead of the Markdown one"},
		}, append(tlsClientFlags(), logFlags()...)...),
		Action: runDRDrill,
	}
}

// drDrillConfig builds the drill's config from the flags.
func drDrillConfig(c *cli.Context) (drill.Config, error) {
	cfg := drill.DefaultConfig()
	cfg.Admin = strings.TrimRight(c.String("admin"), "/")
	cfg.Token = c.String("token")
	cfg.Region = c.String("region")
	cfg.Drain = c.Bool("drain")
	cfg.Force = c.Bool("force")
	hc, err := tlsHTTPClient(c)
	if err != nil {
		return cfg, err
	}
	cfg.HTTP = hc
	cfg.DefaultProbes = !c.Bool("no-default-probes")
	cfg.Controllers = map[string]string{}
	for _, s := range c.StringSlice("controller") {
		region, u, ok := strings.Cut(s, "=")
		if !ok || region == "" || u == "" {
			return cfg, usageError("dr drill: --controller %q: want REGION=URL", s)
		}
		if _, dup := cfg.Controllers[region]; dup {
			return cfg, usageError("dr drill: --controller: %s given twice", region)
		}
		cfg.Controllers[region] = strings.TrimRight(u, "/")
	}
	for _, s := range c.StringSlice("probe") {
		p, err := drill.ParseProbe(s)
		if err != nil {
			return cfg, usageError("dr drill: --probe: %v", err)
		}
		cfg.Probes = append(cfg.Probes, p)
	}
	cfg.Model = c.String("model")
	cfg.Interval, cfg.ProbeTimeout = c.Duration("interval"), c.Duration("probe-timeout")
	cfg.TargetMoved, cfg.TargetBack = c.Duration("target-moved"), c.Duration("target-back")
	cfg.Hold, cfg.AdminTimeout = c.Duration("hold"), c.Duration("admin-timeout")
	cfg.MovedTimeout, cfg.BackTimeout = c.Duration("moved-timeout"), c.Duration("back-timeout")
	// A target beyond the default wait stretches the wait with it.
	if !c.IsSet("moved-timeout") {
		cfg.MovedTimeout = max(cfg.MovedTimeout, 2*cfg.TargetMoved)
	}
	if !c.IsSet("back-timeout") {
		cfg.BackTimeout = max(cfg.BackTimeout, 2*cfg.TargetBack)
	}
	cfg.MaxErrors = c.Int("max-errors")
	cfg.Reason, cfg.Actor = c.String("reason"), globalActor(c)
	log, err := newLogger(c, c.App.ErrWriter)
	if err != nil {
		return cfg, err
	}
	cfg.Logger = log
	if err := cfg.Validate(); err != nil {
		return cfg, usageError("dr drill: %v (see meridian dr drill --help)", flagNames(err))
	}
	return cfg, nil
}

// flagNames rewrites a Config error's field name as its flag.
func flagNames(err error) error {
	msg := strings.TrimPrefix(err.Error(), drill.ErrConfig.Error()+": ")
	msg = strings.NewReplacer(" TargetMoved ", " --target-moved ", " TargetBack ", " --target-back ").Replace(msg)
	for field, flag := range map[string]string{
		"Admin:": "--admin:", "Token:": "--token:", "Controllers": "--controller", "Region:": "--region:", "Probes:": "--probe:",
		"Model:": "--model:", "Interval:": "--interval:", "ProbeTimeout:": "--probe-timeout:", "TargetMoved": "--target-moved",
		"TargetBack": "--target-back", "MovedTimeout:": "--moved-timeout:", "BackTimeout:": "--back-timeout:", "Hold:": "--hold:",
		"AdminTimeout:": "--admin-timeout:",
	} {
		if strings.HasPrefix(msg, field) {
			return errors.New(flag + strings.TrimPrefix(msg, field))
		}
	}
	return errors.New(msg)
}

func runDRDrill(c *cli.Context) error {
	cfg, err := drDrillConfig(c)
	if err != nil {
		return err
	}
	rep, runErr := drill.Run(c.Context, cfg)
	if rep != nil {
		if err := writeDrillReports(c, rep); err != nil {
			return errors.Join(runErr, err)
		}
	}
	switch {
	case runErr != nil:
		return fmt.Errorf("dr drill: %w", runErr)
	case !rep.Passed:
		var missed []string
		for _, ch := range rep.Checks {
			if !ch.Passed {
				missed = append(missed, fmt.Sprintf("%s %s (target %s)", ch.Name, ch.Measured, ch.Target))
			}
		}
		return &exitError{code: exitFailed, err: fmt.Errorf("dr drill of %s failed: %s", rep.Region, strings.Join(missed, "; "))}
	}
	return nil
}

func writeDrillReports(c *cli.Context, rep *drill.Report) error {
	write := func(path string, fn func(io.Writer) error) error {
		f, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("dr drill: report: %w", err)
		}
		if err := fn(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("dr drill: report: %w", err)
		}
		return nil
	}
	if p := c.String("report-md"); p != "" {
		if err := write(p, rep.WriteMarkdown); err != nil {
			return err
		}
	}
	if p := c.String("report-json"); p != "" {
		if err := write(p, rep.WriteJSON); err != nil {
			return err
		}
	}
	out := rep.WriteMarkdown
	if c.Bool("json") {
		out = rep.WriteJSON
	}
	if err := out(c.App.Writer); err != nil {
		return err
	}
	if rep.Moved != nil && rep.Back != nil {
		fmt.Fprintf(c.App.ErrWriter, "dr drill: moved in %v, back in %v\n", rep.Moved.D().Round(time.Millisecond), rep.Back.D().Round(time.Millisecond))
	}
	return nil
}
