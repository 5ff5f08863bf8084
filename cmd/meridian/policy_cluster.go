package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/residency"
)

// policyClusterCommands are the "meridian policy" subcommands that talk to
// the cluster through a controller's admin API: apply, show and
// diff-active. The policy command attaches them.
func policyClusterCommands() []*cli.Command {
	return []*cli.Command{
		{
			Name:  "apply",
			Usage: "validate a policy file on the cluster and make it the active policy (through Raft)",
			ArgsUsage: "FILE (- reads standard input)\n\n" +
				"   A file identical to the active policy (the same SHA-256) adds no version: it prints\n" +
				"   \"unchanged\" and exits 0, so a sync loop can apply the same file again and again.\n" +
				"   --dry-run changes nothing: it validates the file and shows what applying it would change,\n" +
				"   the structural changes and, with --attrs (format: meridian policy diff --help), the sample\n" +
				"   requests it would decide differently.",
			Flags: append(globalAdminFlags(),
				&cli.StringFlag{Name: "reason", Usage: "why, recorded with the version"},
				&cli.BoolFlag{Name: "dry-run", Usage: "change nothing: show what applying the file would change for traffic"},
				attrsFlag(),
			),
			Action: runPolicyApply,
		},
		{
			Name:  "show",
			Usage: "print the active policy (or a kept version, or the history of versions)",
			Flags: append(globalAdminFlags(),
				&cli.BoolFlag{Name: "history", Usage: "list the kept versions instead"},
				&cli.Uint64Flag{Name: "version", Usage: "print kept version `N` instead of the active one"},
				consistentFlag(),
			),
			Action: runPolicyShow,
		},
		{
			Name:      "diff-active",
			Usage:     "show the line differences between the active policy and a file, as a unified diff",
			ArgsUsage: "FILE (- reads standard input)",
			Flags: append(globalAdminFlags(),
				&cli.BoolFlag{Name: "exit-code", Usage: "exit 1 when they differ"},
				&cli.IntFlag{Name: "context", Aliases: []string{"U"}, Value: 3, Usage: "unchanged lines shown around each change"},
			),
			Action: runPolicyDiffActive,
		},
	}
}

func readClusterPolicyFile(c *cli.Context) (string, []byte, error) {
	if c.NArg() != 1 {
		return "", nil, usageError("%s: want exactly one FILE, got %d arguments (flags go before the file)", cmdPath(c), c.NArg())
	}
	name := c.Args().First()
	b, err := readInput(c, name)
	switch {
	case err != nil && name == "-":
		return "", nil, fmt.Errorf("%s: read standard input: %w", cmdPath(c), err)
	case err != nil:
		return "", nil, fmt.Errorf("%s: %w", cmdPath(c), err)
	case name == "-":
		return "stdin", b, nil
	}
	return filepath.Base(name), b, nil
}

func runPolicyApply(c *cli.Context) error {
	if c.IsSet("attrs") && !c.Bool("dry-run") {
		return usageError("%s: --attrs goes with --dry-run (it shows which requests the file would decide differently)", cmdPath(c))
	}
	name, doc, err := readClusterPolicyFile(c)
	if err != nil {
		return err
	}
	if c.Bool("dry-run") {
		return runPolicyApplyDryRun(c, name, doc)
	}
	cl, ctx, cancel, err := globalClient(c)
	if err != nil {
		return err
	}
	defer cancel()
	pv, err := cl.ApplyPolicy(ctx, global.PolicyRequest{Name: name, Document: string(doc), Reason: c.String("reason"),
		Actor: globalActor(c), RequestID: global.NewRequestID()})
	if err != nil {
		return globalError(c, err)
	}
	if c.Bool("json") {
		return writeJSONTo(c.App.Writer, pv)
	}
	if pv.Unchanged {
		_, err = fmt.Fprintf(c.App.Writer, "unchanged: %s is the active policy %s (sha256 %s); no version added\n", name, pv.Ref(), shortHash(pv.SHA256))
		return err
	}
	declared := ""
	if pv.Declared != "" {
		declared = ", declared version " + pv.Declared
	}
	_, err = fmt.Fprintf(c.App.Writer, "applied %s as policy %s (%d bytes, sha256 %s%s)\n", name, pv.Ref(), pv.Size, shortHash(pv.SHA256), declared)
	return err
}

// runPolicyApplyDryRun shows what applying doc would change: nothing when
// it is the active policy; else the version it would become, its
// structural changes and, with --attrs, the sample requests it would
// decide differently. It validates the file as the cluster would (a file
// with problems exits 1, as policy validate) and changes nothing.
func runPolicyApplyDryRun(c *cli.Context, name string, doc []byte) error {
	attrs, lines, err := policyAttrs(c)
	if err != nil {
		return err
	}
	w := c.App.Writer
	cand, err := residency.Parse(name, doc)
	if err != nil {
		var ve *residency.ValidationError
		if errors.As(err, &ve) {
			for _, p := range ve.Problems {
				fmt.Fprintln(w, p.String())
			}
		}
		return &exitError{code: exitFailed, err: fmt.Errorf("%s: %s would be refused: %w", cmdPath(c), name, err)}
	}
	cl, ctx, cancel, err := globalClient(c)
	if err != nil {
		return err
	}
	defer cancel()
	active, err := cl.Policy(ctx, global.ReadOptions{})
	var (
		old     *residency.Policy
		oldName string
		next    uint64 = 1
	)
	switch {
	case errors.Is(err, global.ErrNotFound):
		// The controllers route on their fallback: the shipped default,
		// or the bootstrap policy of their configuration.
		if old, err = residency.DefaultPolicy(); err != nil {
			return err
		}
		oldName = "no policy applied (compared with the shipped default)"
	case err != nil:
		return globalError(c, err)
	default:
		sum := sha256.Sum256(doc)
		if hex.EncodeToString(sum[:]) == active.SHA256 {
			if c.Bool("json") {
				return writeJSONTo(w, map[string]any{"dry_run": true, "unchanged": true, "active": active.Ref()})
			}
			_, err := fmt.Fprintf(w, "unchanged: %s is the active policy %s; applying it would add no version\n", name, active.Ref())
			return err
		}
		if old, err = residency.Parse(active.Name, active.Document); err != nil {
			return fmt.Errorf("%s: the active policy %s does not parse here (%v): is this meridian older than the controllers?", cmdPath(c), active.Ref(), err)
		}
		oldName, next = "active policy "+active.Ref(), active.Version+1
	}
	if !c.Bool("json") {
		fmt.Fprintf(w, "dry run: nothing applied; %s would become policy v%d\n", name, next)
	}
	if _, _, err := writePolicyDiff(c, oldName, old, name, cand, attrs, lines); err != nil {
		return fmt.Errorf("%s: %w", cmdPath(c), err)
	}
	if !c.IsSet("attrs") && !c.Bool("json") {
		fmt.Fprintln(w, "(give --attrs FILE with sample requests to see which of them it would decide differently)")
	}
	return nil
}

func runPolicyShow(c *cli.Context) error {
	if c.Bool("history") && c.IsSet("version") {
		return usageError("%s: --history and --version are exclusive", cmdPath(c))
	}
	cl, ctx, cancel, err := globalClient(c)
	if err != nil {
		return err
	}
	defer cancel()
	ro := readOptions(c)
	w := c.App.Writer
	if c.Bool("history") {
		h, err := cl.PolicyHistory(ctx, ro)
		if err != nil {
			return globalError(c, err)
		}
		if c.Bool("json") {
			return writeJSONTo(w, h)
		}
		if len(h.Versions) == 0 {
			_, err := fmt.Fprintln(w, "no policy has been applied")
			return err
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tAPPLIED\tBY\tFILE\tDECLARED\tSHA256\tREASON")
		for i := len(h.Versions) - 1; i >= 0; i-- {
			p := h.Versions[i]
			ref := p.Ref()
			if i == len(h.Versions)-1 {
				ref += " (active)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ref, fmtTime(p.AppliedAt), orDash(p.Actor), orDash(p.Name), orDash(p.Declared), shortHash(p.SHA256), orDash(p.Reason))
		}
		return tw.Flush()
	}
	var pv global.PolicyVersion
	if c.IsSet("version") {
		pv, err = cl.PolicyVersion(ctx, c.Uint64("version"), ro)
	} else {
		pv, err = cl.Policy(ctx, ro)
	}
	if err != nil {
		return globalError(c, err)
	}
	if c.Bool("json") {
		return writeJSONTo(w, pv)
	}
	fmt.Fprintf(w, "# policy %s from %s, applied %s by %s, sha256 %s\n", pv.Ref(), orDash(pv.Name), fmtTime(pv.AppliedAt), orDash(pv.Actor), pv.SHA256)
	if pv.Document == nil {
		_, err = fmt.Fprintln(w, "# (the document of this version is no longer kept; only its metadata)")
		return err
	}
	_, err = w.Write(pv.Document)
	if err == nil && !bytes.HasSuffix(pv.Document, []byte("\n")) {
		_, err = fmt.Fprintln(w)
	}
	return err
}

// diffResult is the --json output of diff-active.
type diffResult struct {
	Active string `json:"active"`
	File   string `json:"file"`
	Same   bool   `json:"same"`
	Hunks  []hunk `json:"hunks,omitempty"`
}

func runPolicyDiffActive(c *cli.Context) error {
	if c.Int("context") < 0 {
		return usageError("%s: --context %d: want 0 or more lines", cmdPath(c), c.Int("context"))
	}
	name, doc, err := readClusterPolicyFile(c)
	if err != nil {
		return err
	}
	cl, ctx, cancel, err := globalClient(c)
	if err != nil {
		return err
	}
	defer cancel()
	pv, err := cl.Policy(ctx, global.ReadOptions{})
	if err != nil {
		return globalError(c, err)
	}
	hunks := unifiedHunks(diffLines(splitLines(string(pv.Document)), splitLines(string(doc))), c.Int("context"))
	same := len(hunks) == 0
	w := c.App.Writer
	if c.Bool("json") {
		if err := writeJSONTo(w, diffResult{Active: pv.Ref(), File: name, Same: same, Hunks: hunks}); err != nil {
			return err
		}
	} else if same {
		fmt.Fprintf(w, "%s is identical to the active policy %s\n", name, pv.Ref())
	} else if err := writeUnified(w, fmt.Sprintf("active policy %s (sha256 %s)", pv.Ref(), shortHash(pv.SHA256)), name, hunks); err != nil {
		return err
	}
	if !same && c.Bool("exit-code") {
		return &exitError{code: exitFailed}
	}
	return nil
}

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
