package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/residency"
)

// policyCommand builds "meridian policy": validate and diff need no cluster;
// the global tier appends apply and show as extra subcommands.
func policyCommand(extra ...*cli.Command) *cli.Command {
	return &cli.Command{
		Name:        "policy",
		Usage:       "check and compare data-residency policy files (format: go doc ./residency)",
		Subcommands: append([]*cli.Command{policyValidateCommand(), policyDiffCommand()}, extra...),
	}
}

func policyValidateCommand() *cli.Command {
	return &cli.Command{
		Name:  "validate",
		Usage: "validate policy files offline; print every problem as FILE:LINE:COL: message",
		ArgsUsage: "FILE... (- reads standard input)\n\n" +
			"   Exit status: 0 when every file is valid, 1 when any has a problem, 2 for usage errors.\n" +
			"   Flags go before the files.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"},
		},
		Action: runPolicyValidate,
	}
}

// validateResult is one file's result in --json output.
type validateResult struct {
	File     string              `json:"file"`
	OK       bool                `json:"ok"`
	Revision string              `json:"revision,omitempty"`
	ID       string              `json:"id,omitempty"`
	Regions  int                 `json:"regions,omitempty"`
	Zones    int                 `json:"zones,omitempty"`
	Rules    int                 `json:"rules,omitempty"`
	Problems []residency.Problem `json:"problems"`
}

// readInput reads the file name, or standard input (the app's Reader) for "-".
func readInput(c *cli.Context, name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(c.App.Reader)
	}
	return os.ReadFile(name)
}

// loadPolicy reads and parses one file; a file that cannot be read becomes a
// problem at 1:1 so that every failure prints as FILE:LINE:COL: message.
func loadPolicy(c *cli.Context, name string) (*residency.Policy, []residency.Problem) {
	data, err := readInput(c, name)
	if err != nil {
		return nil, []residency.Problem{{File: name, Line: 1, Column: 1, Message: "cannot read: " + err.Error()}}
	}
	p, err := residency.Parse(name, data)
	var ve *residency.ValidationError
	if errors.As(err, &ve) {
		return nil, ve.Problems
	}
	if err != nil {
		return nil, []residency.Problem{{File: name, Line: 1, Column: 1, Message: err.Error()}}
	}
	return p, nil
}

func runPolicyValidate(c *cli.Context) error {
	files := c.Args().Slice()
	if len(files) == 0 {
		return usageError("policy validate: name at least one policy file")
	}
	for _, f := range files {
		if strings.HasPrefix(f, "-") && f != "-" {
			return usageError("policy validate: flag %s after the files: put flags first", f)
		}
	}
	w := c.App.Writer
	var results []validateResult
	bad, total := 0, 0
	for _, f := range files {
		p, problems := loadPolicy(c, f)
		r := validateResult{File: f, OK: p != nil, Problems: problems}
		if p != nil {
			r.Revision, r.ID = p.Revision(), p.ID()
			r.Regions, r.Zones, r.Rules = len(p.Regions()), len(p.Zones()), len(p.Rules())
			r.Problems = []residency.Problem{}
		} else {
			bad++
			total += len(problems)
		}
		results = append(results, r)
		if c.Bool("json") {
			continue
		}
		for _, pr := range problems {
			fmt.Fprintln(w, pr.String())
		}
		if p != nil {
			fmt.Fprintf(w, "%s: ok (policy %s: %d regions, %d zones, %d rules)\n", f, p.ID(), r.Regions, r.Zones, r.Rules)
		}
	}
	if c.Bool("json") {
		if err := writeJSONTo(w, map[string]any{"files": results, "problems": total}); err != nil {
			return fmt.Errorf("policy validate: write json: %w", err)
		}
	}
	if bad > 0 {
		return &exitError{code: exitFailed, err: fmt.Errorf("policy validate: %d problem%s in %d of %d file%s", total, policyPlural(total), bad, len(files), policyPlural(len(files)))}
	}
	return nil
}

func policyPlural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func policyDiffCommand() *cli.Command {
	return &cli.Command{
		Name:  "diff",
		Usage: "compare two policy files: what changed, and (with --attrs) which requests they decide differently",
		ArgsUsage: "OLD NEW\n\n" + attrsFormatHelp + "\n\n" +
			"   Exit status: 0, or 1 when a policy file has a problem (or, with --exit-code, when the policies\n" +
			"   differ); 2 for usage errors, an --attrs file that cannot be read or has a bad line among them.",
		Flags: []cli.Flag{
			attrsFlag(),
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"},
			&cli.BoolFlag{Name: "exit-code", Usage: "exit 1 when the policies differ in structure or in a decision"},
		},
		Action: runPolicyDiff,
	}
}

// attrsFormatHelp documents the --attrs file (policy diff, policy apply
// --dry-run): README.md says the same.
const attrsFormatHelp = `   --attrs FILE holds sample requests, one JSON object per line: the request attributes the policy
   decides on, as a controller sees them once the client is authenticated:
     tenant         the tenant (from the API key, the JWT, or a trusted gateway's X-Tenant-Id)
     data_class     the data class (the identity's default, or X-Data-Class narrowing it)
     origin_region  the region whose controller received the request
     session        X-Session-Id (only rules with a condition read it)
     model          the requested model (conditions only)
     labels         other string attributes, {"key": "value"} (conditions only)
   Every key is optional (an absent one is the empty string); an unknown key is an error. Blank lines
   and lines starting with # are skipped. For example:
     # EU health records entering in the US
     {"tenant":"eu-health","data_class":"phi","origin_region":"us-east-1"}
     {"tenant":"acme","data_class":"public","origin_region":"us-east-1","session":"eval-7","labels":{"priority":"batch"}}
   Each line is evaluated under both policies; the lines decided differently are printed as
   FILE:LINE: attributes: old regions by old rule -> new regions by new rule.`

// attrsFlag is --attrs of policy diff and policy apply.
func attrsFlag() cli.Flag {
	return &cli.StringFlag{Name: "attrs", Usage: "JSON-lines `FILE` of sample request attributes to evaluate under both policies (format: meridian policy diff --help)"}
}

// decisionJSON is a decision in --json output.
type decisionJSON struct {
	Regions  []string          `json:"regions"`
	Outcome  string            `json:"outcome"`
	Rule     residency.RuleRef `json:"rule"`
	DeniedBy string            `json:"denied_by,omitempty"`
	Reason   string            `json:"reason"`
	Policy   string            `json:"policy"`
}

func toDecisionJSON(d residency.Decision) decisionJSON {
	regions := d.Regions()
	if regions == nil {
		regions = []string{}
	}
	return decisionJSON{Regions: regions, Outcome: d.Outcome.String(), Rule: d.Rule, DeniedBy: d.DeniedBy.Name, Reason: d.Reason(), Policy: d.PolicyID}
}

type differenceJSON struct {
	Line      int                  `json:"line"`
	Attrs     residency.Attributes `json:"attrs"`
	Active    decisionJSON         `json:"old"`
	Candidate decisionJSON         `json:"new"`
}

// readAttrs reads JSON lines of attributes, remembering each one's line.
func readPolicyAttrs(name string) ([]residency.Attributes, []int, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, nil, fmt.Errorf("read attrs: %w", err)
	}
	var attrs []residency.Attributes
	var lines []int
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(l))
		dec.DisallowUnknownFields()
		var a residency.Attributes
		if err := dec.Decode(&a); err != nil {
			return nil, nil, fmt.Errorf("%s:%d: bad attributes: %w", name, n, err)
		}
		attrs = append(attrs, a)
		lines = append(lines, n)
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("read attrs %s: %w", name, err)
	}
	return attrs, lines, nil
}

func runPolicyDiff(c *cli.Context) error {
	args := c.Args().Slice()
	if len(args) != 2 {
		return usageError("policy diff: want OLD NEW, got %d argument%s (flags go first)", len(args), policyPlural(len(args)))
	}
	w := c.App.Writer
	attrs, lines, err := policyAttrs(c)
	if err != nil {
		return err
	}
	old, p1 := loadPolicy(c, args[0])
	cand, p2 := loadPolicy(c, args[1])
	if problems := append(p1, p2...); len(problems) > 0 {
		for _, pr := range problems {
			fmt.Fprintln(w, pr.String())
		}
		return &exitError{code: exitFailed, err: fmt.Errorf("policy diff: %d problem%s in the policy files", len(problems), policyPlural(len(problems)))}
	}
	changes, diffs, err := writePolicyDiff(c, args[0], old, args[1], cand, attrs, lines)
	if err != nil {
		return fmt.Errorf("policy diff: %w", err)
	}
	if c.Bool("exit-code") && (changes > 0 || diffs > 0) {
		return &exitError{code: exitFailed, err: fmt.Errorf("policy diff: the policies differ (%d change%s, %d decision%s)", changes, policyPlural(changes), diffs, policyPlural(diffs))}
	}
	return nil
}

// policyAttrs reads --attrs, if given. A file that cannot be read or holds
// a line that is not an attributes object is a usage error: nothing is
// compared.
func policyAttrs(c *cli.Context) ([]residency.Attributes, []int, error) {
	f := c.String("attrs")
	if f == "" {
		return nil, nil, nil
	}
	attrs, lines, err := readPolicyAttrs(f)
	if err != nil {
		return nil, nil, usageError("%s: %w (see meridian policy diff --help for the format)", cmdPath(c), err)
	}
	return attrs, lines, nil
}

// writePolicyDiff writes what changes from old to cand (as --json asks):
// the structural changes and, for the sample requests of --attrs (attrs,
// with their lines in the file), those decided differently. It returns
// how many of each.
func writePolicyDiff(c *cli.Context, oldName string, old *residency.Policy, newName string, cand *residency.Policy,
	attrs []residency.Attributes, lines []int) (changes, decisions int, err error) {
	w := c.App.Writer
	structural := residency.DiffStructure(old, cand)
	diffs := residency.Diff(old, cand, attrs)
	if c.Bool("json") {
		out := struct {
			Old         string             `json:"old"`
			New         string             `json:"new"`
			Changes     []residency.Change `json:"changes"`
			Requests    int                `json:"requests"`
			Differences []differenceJSON   `json:"differences"`
		}{Old: old.ID(), New: cand.ID(), Changes: structural, Requests: len(attrs), Differences: []differenceJSON{}}
		if out.Changes == nil {
			out.Changes = []residency.Change{}
		}
		for _, d := range diffs {
			out.Differences = append(out.Differences, differenceJSON{Line: lines[d.Index], Attrs: d.Attrs, Active: toDecisionJSON(d.Active), Candidate: toDecisionJSON(d.Candidate)})
		}
		if err := writeJSONTo(w, out); err != nil {
			return 0, 0, fmt.Errorf("write json: %w", err)
		}
		return len(structural), len(diffs), nil
	}
	fmt.Fprintf(w, "--- %s (policy %s)\n+++ %s (policy %s)\n", oldName, old.ID(), newName, cand.ID())
	for _, ch := range structural {
		fmt.Fprintln(w, ch.String())
	}
	if len(structural) == 0 {
		fmt.Fprintln(w, "no structural changes")
	}
	if f := c.String("attrs"); f != "" {
		for _, d := range diffs {
			fmt.Fprintf(w, "%s:%d: %s\n", f, lines[d.Index], d)
		}
		fmt.Fprintf(w, "%d of %d request%s decided differently\n", len(diffs), len(attrs), policyPlural(len(attrs)))
	}
	return len(structural), len(diffs), nil
}
