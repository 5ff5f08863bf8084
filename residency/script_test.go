package residency

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden output of testdata/*.txt scripts")

// A script (testdata/*.txt) is a list of commands, each written as
//
//	command arg=value ...
//	input lines
//	----
//	expected output lines
//	(a blank line ends the expected output)
//
// Commands:
//
//	policy name=N [file=F]   parse the input as policy N (file name F in problems):
//	                         prints "ok ..." or every problem
//	eval policy=N            one request per input line (key=value ...; labels.k=v):
//	                         prints the decision
//	diff old=N new=M         structural diff, then (with input lines) the requests
//	                         decided differently
//
// Lines starting with '#' between commands are comments. go test -update
// rewrites the expected output.
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) { runScript(t, file) })
	}
}

type scriptCmd struct {
	line     int
	header   string
	input    []string
	expected []string
	pre      []string // comment and blank lines before the command
}

func parseScript(t *testing.T, file string) ([]scriptCmd, []string) {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	var cmds []scriptCmd
	var pre []string
	for i := 0; i < len(lines); {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			pre = append(pre, l)
			i++
			continue
		}
		c := scriptCmd{line: i + 1, header: l, pre: pre}
		pre = nil
		i++
		for i < len(lines) && lines[i] != "----" {
			c.input = append(c.input, lines[i])
			i++
		}
		if i == len(lines) {
			t.Fatalf("%s:%d: command without ----", file, c.line)
		}
		i++
		for i < len(lines) && lines[i] != "" {
			c.expected = append(c.expected, lines[i])
			i++
		}
		cmds = append(cmds, c)
	}
	return cmds, pre
}

func runScript(t *testing.T, file string) {
	cmds, trailer := parseScript(t, file)
	policies := map[string]*Policy{}
	var out strings.Builder
	for i := range cmds {
		c := &cmds[i]
		got := runScriptCmd(t, file, c, policies)
		if !*update && strings.Join(got, "\n") != strings.Join(c.expected, "\n") {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", file, c.line, c.header, strings.Join(got, "\n"), strings.Join(c.expected, "\n"))
		}
		for _, l := range c.pre {
			out.WriteString(l + "\n")
		}
		out.WriteString(c.header + "\n")
		for _, l := range c.input {
			out.WriteString(l + "\n")
		}
		out.WriteString("----\n")
		for _, l := range got {
			out.WriteString(l + "\n")
		}
	}
	for _, l := range trailer {
		out.WriteString(l + "\n")
	}
	if *update {
		if err := os.WriteFile(file, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func runScriptCmd(t *testing.T, file string, c *scriptCmd, policies map[string]*Policy) []string {
	fields := strings.Fields(c.header)
	args := map[string]string{}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			t.Fatalf("%s:%d: argument %q is not key=value", file, c.line, f)
		}
		args[k] = v
	}
	get := func(k string) *Policy {
		p := policies[args[k]]
		if p == nil {
			t.Fatalf("%s:%d: no valid policy %q", file, c.line, args[k])
		}
		return p
	}
	var out []string
	switch fields[0] {
	case "policy":
		name := args["file"]
		if name == "" {
			name = args["name"] + ".yaml"
		}
		src := strings.Join(c.input, "\n") + "\n"
		p, err := Parse(name, []byte(src))
		if err != nil {
			for _, pr := range err.(*ValidationError).Problems {
				out = append(out, pr.String())
			}
			return out
		}
		policies[args["name"]] = p
		out = append(out, fmt.Sprintf("ok: %d regions, %d zones, %d rules, revision %q", len(p.Regions()), len(p.Zones()), len(p.Rules()), p.Revision()))
	case "eval":
		p := get("policy")
		for _, l := range c.input {
			a := scriptAttrs(t, file, c.line, l)
			d := p.Evaluate(a)
			out = append(out, fmt.Sprintf("%s -> [%s] %s: %s", FormatAttributes(a), strings.Join(d.Regions(), " "), d.Outcome, d.Reason()))
		}
	case "diff":
		old, cand := get("old"), get("new")
		for _, ch := range DiffStructure(old, cand) {
			out = append(out, ch.String())
		}
		var attrs []Attributes
		for _, l := range c.input {
			attrs = append(attrs, scriptAttrs(t, file, c.line, l))
		}
		diffs := Diff(old, cand, attrs)
		for _, d := range diffs {
			out = append(out, d.String())
		}
		if len(attrs) > 0 {
			out = append(out, fmt.Sprintf("%d of %d requests decided differently", len(diffs), len(attrs)))
		}
	default:
		t.Fatalf("%s:%d: unknown command %q", file, c.line, fields[0])
	}
	return out
}

func scriptAttrs(t *testing.T, file string, line int, l string) Attributes {
	var a Attributes
	for _, f := range strings.Fields(l) {
		k, v, _ := strings.Cut(f, "=")
		switch {
		case k == "tenant":
			a.Tenant = v
		case k == "data_class":
			a.DataClass = v
		case k == "origin_region":
			a.OriginRegion = v
		case k == "session":
			a.Session = v
		case k == "model":
			a.Model = v
		case strings.HasPrefix(k, "labels."):
			if a.Labels == nil {
				a.Labels = map[string]string{}
			}
			a.Labels[strings.TrimPrefix(k, "labels.")] = v
		default:
			t.Fatalf("%s:%d: unknown attribute %q", file, line, k)
		}
	}
	return a
}
