package check_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/meridian-llm/meridian/dr/check"
	"github.com/meridian-llm/meridian/dr/check/checktest"
)

var update = flag.Bool("update", false, "rewrite the expected output of testdata/*.txt")

// TestScripts runs the DR scenarios in testdata/*.txt. Each file holds
// commands that build a folder from a healthy generated one and break it,
// then "----", then the expected output of its check/init commands (with
// the temporary directory shown as $WORK). Commands:
//
//	healthy [bf16|awq]          replace $WORK with a healthy folder
//	rm PATH...                  delete files or directories
//	write PATH                  write the lines up to "EOF" into PATH
//	json-set PATH KEY JSON      set a key of a JSON file (a.b, or a/b.c when names hold dots)
//	json-del PATH KEY           delete a (dotted) key of a JSON file
//	yaml-set PATH KEY VALUE     set a top-level key of a YAML file (VALUE is YAML)
//	yaml-del PATH KEY           delete a top-level key of a YAML file
//	truncate PATH SIZE          cut a file to SIZE bytes (-N: N bytes shorter)
//	flip PATH OFFSET            invert one byte (negative: from the end)
//	symlink PATH TARGET         make PATH a symlink to TARGET
//	mv SRC DST                  rename a file or directory
//	spm PATH N                  write a SentencePiece model of N pieces
//	tiktoken PATH N             write a tiktoken rank file of N tokens
//	manifest [flags]            write $WORK/dr-manifest.yaml (flags: --no-checksums, --force)
//	region NAME                 copy $WORK to $REGIONS/NAME
//	check [flags]               run the check and print the text report and
//	                            exit status (flags: --manifest, --checksums=MODE,
//	                            --compare=A,B (regions), --json)
//	init                        print the manifest init would write
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scripts in testdata")
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			runScript(t, file)
		})
	}
}

func runScript(t *testing.T, file string) {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	script, want, ok := strings.Cut(string(data), "\n----\n")
	if !ok {
		t.Fatalf("%s: no ---- line", file)
	}
	root := t.TempDir()
	s := &scriptState{t: t, work: filepath.Join(root, "work"), regions: filepath.Join(root, "regions")}
	if err := os.MkdirAll(s.work, 0o755); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(script, "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		args := strings.Fields(line)
		if args[0] == "write" {
			var body []string
			for i++; i < len(lines) && lines[i] != "EOF"; i++ {
				body = append(body, lines[i])
			}
			args = append(args, strings.Join(body, "\n")+"\n")
		}
		if err := s.run(args); err != nil {
			t.Fatalf("%s:%d: %s: %v", file, i+1, line, err)
		}
	}
	got := strings.ReplaceAll(s.out.String(), root, "$TMP")
	if *update {
		if err := os.WriteFile(file, []byte(script+"\n----\n"+got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if got != want {
		t.Errorf("%s: output differs (run go test ./dr/check -run TestScripts -update to accept)\n--- got\n%s\n--- want\n%s", file, got, want)
	}
}

type scriptState struct {
	t             *testing.T
	work, regions string
	out           bytes.Buffer
}

func (s *scriptState) path(p string) string { return filepath.Join(s.work, filepath.FromSlash(p)) }

func (s *scriptState) run(args []string) error {
	cmd, args := args[0], args[1:]
	switch cmd {
	case "healthy":
		v := checktest.BF16
		if len(args) > 0 {
			v = checktest.Variant(args[0])
		}
		if err := os.RemoveAll(s.work); err != nil {
			return err
		}
		return checktest.WriteHealthy(s.work, v)
	case "rm":
		for _, p := range args {
			if _, err := os.Lstat(s.path(p)); err != nil {
				return err
			}
			if err := os.RemoveAll(s.path(p)); err != nil {
				return err
			}
		}
		return nil
	case "write":
		p := s.path(args[0])
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, []byte(args[len(args)-1]), 0o644)
	case "json-set", "json-del":
		return s.editJSON(cmd == "json-del", args)
	case "yaml-set", "yaml-del":
		return s.editYAML(cmd == "yaml-del", args)
	case "truncate":
		st, err := os.Stat(s.path(args[0]))
		if err != nil {
			return err
		}
		n, err := strconv.ParseInt(args[1], 10, 64)
		if err != nil {
			return err
		}
		if n < 0 {
			n = st.Size() + n
		}
		return os.Truncate(s.path(args[0]), n)
	case "flip":
		b, err := os.ReadFile(s.path(args[0]))
		if err != nil {
			return err
		}
		off, err := strconv.Atoi(args[1])
		if err != nil {
			return err
		}
		if off < 0 {
			off += len(b)
		}
		b[off] ^= 0xff
		return os.WriteFile(s.path(args[0]), b, 0o644)
	case "symlink":
		return os.Symlink(args[1], s.path(args[0]))
	case "mv":
		if err := os.MkdirAll(filepath.Dir(s.path(args[1])), 0o755); err != nil {
			return err
		}
		return os.Rename(s.path(args[0]), s.path(args[1]))
	case "spm", "tiktoken":
		n, err := strconv.Atoi(args[1])
		if err != nil {
			return err
		}
		b := checktest.SentencePiece(n)
		if cmd == "tiktoken" {
			b = checktest.Tiktoken(n)
		}
		return os.WriteFile(s.path(args[0]), b, 0o644)
	case "manifest":
		m, rep, err := check.InitManifest(context.Background(), check.DefaultConfig(), check.Source{Dir: s.work},
			check.InitOptions{Checksums: !slices.Contains(args, "--no-checksums"), Exclude: []string{check.DefaultManifestName}})
		if err != nil {
			return err
		}
		if !rep.OK() && !slices.Contains(args, "--force") {
			return fmt.Errorf("manifest of an unhealthy folder: %v", rep.Findings)
		}
		b, err := m.Marshal()
		if err != nil {
			return err
		}
		return os.WriteFile(s.path(check.DefaultManifestName), b, 0o644)
	case "region":
		return os.CopyFS(filepath.Join(s.regions, args[0]), os.DirFS(s.work))
	case "check":
		return s.check(args)
	case "init":
		m, _, err := check.InitManifest(context.Background(), check.DefaultConfig(), check.Source{Dir: s.work},
			check.InitOptions{Checksums: true, Exclude: []string{check.DefaultManifestName}})
		if err != nil {
			return err
		}
		b, err := m.Marshal()
		if err != nil {
			return err
		}
		fmt.Fprintf(&s.out, "> init\n%s\n", b)
		return nil
	}
	return fmt.Errorf("unknown command %q", cmd)
}

func (s *scriptState) check(args []string) error {
	cfg := check.DefaultConfig()
	cfg.Workers = 2
	req := check.Request{Sources: []check.Source{{Dir: s.work}}, Exclude: []string{check.DefaultManifestName}}
	asJSON := false
	for _, a := range args {
		k, v, _ := strings.Cut(a, "=")
		switch k {
		case "--manifest":
			p := s.path(check.DefaultManifestName)
			m, err := check.LoadManifest(p)
			if err != nil {
				fmt.Fprintf(&s.out, "> check %s\nerror: %v\n\n", strings.Join(args, " "), err)
				return nil
			}
			req.Manifest, req.ManifestPath = m, check.DefaultManifestName
		case "--checksums":
			mode, err := check.ParseChecksumMode(v)
			if err != nil {
				return err
			}
			cfg.Checksums = mode
		case "--compare":
			req.Sources = nil
			for _, r := range strings.Split(v, ",") {
				req.Sources = append(req.Sources, check.Source{Region: r, Dir: filepath.Join(s.regions, r)})
			}
		case "--json":
			asJSON = true
		default:
			return fmt.Errorf("unknown check flag %q", a)
		}
	}
	rep, err := check.Run(context.Background(), cfg, req)
	if err != nil {
		return err
	}
	fmt.Fprintf(&s.out, "%s\n", strings.TrimSpace("> check "+strings.Join(args, " ")))
	if asJSON {
		err = rep.WriteJSON(&s.out)
	} else {
		err = rep.WriteText(&s.out)
	}
	if err != nil {
		return err
	}
	status := 0
	if !rep.OK() {
		status = 1
	}
	fmt.Fprintf(&s.out, "exit status %d\n\n", status)
	return nil
}

// setPath sets or deletes a dotted (or, when it holds a slash,
// slash-separated) key in a decoded JSON object.
func setPath(doc map[string]any, key string, val any, del bool) error {
	sep := "."
	if strings.Contains(key, "/") {
		sep = "/"
	}
	parts := strings.Split(key, sep)
	m := doc
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			return fmt.Errorf("no object at %q", p)
		}
		m = next
	}
	last := parts[len(parts)-1]
	if del {
		if _, ok := m[last]; !ok {
			return fmt.Errorf("no key %q", key)
		}
		delete(m, last)
		return nil
	}
	m[last] = val
	return nil
}

func (s *scriptState) editJSON(del bool, args []string) error {
	p := s.path(args[0])
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		return err
	}
	var val any
	if !del {
		if err := json.Unmarshal([]byte(strings.Join(args[2:], " ")), &val); err != nil {
			return fmt.Errorf("value: %w", err)
		}
	}
	if err := setPath(doc, args[1], val, del); err != nil {
		return err
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(p, append(out, '\n'), 0o644)
}

func (s *scriptState) editYAML(del bool, args []string) error {
	p := s.path(args[0])
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return err
	}
	if del {
		delete(doc, args[1])
	} else {
		var val any
		if err := yaml.Unmarshal([]byte(strings.Join(args[2:], " ")), &val); err != nil {
			return err
		}
		doc[args[1]] = val
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return err
	}
	return os.WriteFile(p, out, 0o644)
}
