package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/dr/check"
)

// drCommand builds "meridian dr"; extra subcommands (the failover drill)
// are appended after check and manifest.
func drCommand(extra ...*cli.Command) *cli.Command {
	return &cli.Command{
		Name:        "dr",
		Usage:       "disaster recovery: check that a region's copy of a model deployment can serve",
		Subcommands: append([]*cli.Command{drCheckCommand(), drManifestCommand()}, extra...),
	}
}

func drCheckCommand() *cli.Command {
	return &cli.Command{
		Name:  "check",
		Usage: "check a model deployment folder (weights, tokenizer, configs, engine, deployment) or compare region copies",
		ArgsUsage: "[DIR] | --compare REGION=DIR [REGION=DIR ...]\n\n" +
			"   Exit status: 0 without blocking findings, 1 with any, 2 for usage errors.\n" +
			"   Flags go before DIR and REGION=DIR arguments. Without --manifest, DIR/" + check.DefaultManifestName + " is used if present.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "manifest", Aliases: []string{"m"}, Usage: "DR manifest (YAML) listing what a region needs; DIR defaults to its directory"},
			&cli.StringSliceFlag{Name: "compare", Usage: "REGION=DIR copy to compare (repeat, or list more REGION=DIR after the flags)"},
			&cli.StringFlag{Name: "checksums", Value: "auto", Usage: "auto: verify the manifest's sha256 (and hash small files when comparing); always: hash every file; never: hash nothing"},
			&cli.IntFlag{Name: "workers", Usage: "files read in parallel", DefaultText: "GOMAXPROCS"},
			&cli.BoolFlag{Name: "no-manifest", Usage: "ignore DIR/" + check.DefaultManifestName},
			&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
		},
		Action: runDRCheck,
	}
}

func drConfig(c *cli.Context, checksums string) (check.Config, error) {
	cfg := check.DefaultConfig()
	mode, err := check.ParseChecksumMode(checksums)
	if err != nil {
		return cfg, usageError("--checksums: %v", err)
	}
	cfg.Checksums = mode
	if w := c.Int("workers"); w != 0 {
		cfg.Workers = w
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageError("%v", err)
	}
	return cfg, nil
}

func runDRCheck(c *cli.Context) error {
	cfg, err := drConfig(c, c.String("checksums"))
	if err != nil {
		return err
	}
	var dirs []string
	specs := c.StringSlice("compare")
	for _, a := range c.Args().Slice() {
		switch {
		case strings.HasPrefix(a, "-"):
			return usageError("dr check: flag %s after the arguments: put flags before DIR and REGION=DIR", a)
		case len(specs) > 0 && strings.Contains(a, "="):
			specs = append(specs, a)
		default:
			dirs = append(dirs, a)
		}
	}
	req := check.Request{}
	manifestPath := c.String("manifest")
	switch {
	case len(specs) > 0 && len(dirs) > 0:
		return usageError("dr check: give either DIR or --compare REGION=DIR ..., not both")
	case len(specs) == 1:
		return usageError("dr check: --compare needs at least two REGION=DIR copies")
	case len(specs) > 1:
		for _, s := range specs {
			region, dir, ok := strings.Cut(s, "=")
			if !ok || region == "" || dir == "" {
				return usageError("dr check: --compare %q: want REGION=DIR", s)
			}
			req.Sources = append(req.Sources, check.Source{Region: region, Dir: dir})
		}
	case len(dirs) > 1:
		return usageError("dr check: one DIR at a time (use --compare REGION=DIR ... to compare copies)")
	case len(dirs) == 1:
		req.Sources = []check.Source{{Dir: dirs[0]}}
	case manifestPath != "":
		req.Sources = []check.Source{{Dir: filepath.Dir(manifestPath)}}
	default:
		return usageError("dr check: give DIR, --manifest FILE or --compare REGION=DIR REGION=DIR")
	}
	if manifestPath == "" && !c.Bool("no-manifest") && len(req.Sources) == 1 {
		if p := filepath.Join(req.Sources[0].Dir, check.DefaultManifestName); fileExists(p) {
			manifestPath = p
		}
	}
	if manifestPath != "" {
		m, err := check.LoadManifest(manifestPath)
		if err != nil {
			return err
		}
		req.Manifest, req.ManifestPath = m, manifestPath
		req.Exclude = manifestExclusions(manifestPath, req.Sources)
	} else {
		req.Exclude = []string{check.DefaultManifestName}
	}
	rep, err := check.Run(c.Context, cfg, req)
	if err != nil {
		return err
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
		return &exitError{code: exitFailed, err: fmt.Errorf("dr check: %d blocking findings", rep.Counts.Blocking)}
	}
	return nil
}

// manifestExclusions returns the manifest's folder-relative path when it
// lies inside the checked folders, so it is not reported as unlisted.
func manifestExclusions(manifest string, srcs []check.Source) []string {
	abs, err := filepath.Abs(manifest)
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range srcs {
		dir, err := filepath.Abs(s.Dir)
		if err != nil {
			continue
		}
		if rel, err := filepath.Rel(dir, abs); err == nil && !strings.HasPrefix(rel, "..") {
			out = append(out, filepath.ToSlash(rel))
		}
	}
	return append(out, check.DefaultManifestName)
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

func drManifestCommand() *cli.Command {
	return &cli.Command{
		Name:  "manifest",
		Usage: "write DR manifests",
		Subcommands: []*cli.Command{{
			Name:      "init",
			Usage:     "check a healthy folder and write the manifest listing its files, kinds, sizes and sha256 (keep it in git)",
			ArgsUsage: "DIR",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "where to write the manifest; - for stdout (default DIR/" + check.DefaultManifestName + ")"},
				&cli.StringFlag{Name: "model", Usage: "model name to record (default config.json _name_or_path)"},
				&cli.BoolFlag{Name: "no-checksums", Usage: "record sizes only (skips reading every byte of the weights)"},
				&cli.BoolFlag{Name: "force", Usage: "write the manifest even if the folder has blocking findings"},
				&cli.IntFlag{Name: "workers", Usage: "files read in parallel", DefaultText: "GOMAXPROCS"},
			},
			Action: runDRManifestInit,
		}},
	}
}

func runDRManifestInit(c *cli.Context) error {
	if c.NArg() != 1 {
		return usageError("dr manifest init: want exactly one DIR")
	}
	dir := c.Args().First()
	cfg, err := drConfig(c, "auto")
	if err != nil {
		return err
	}
	out := c.String("output")
	if out == "" {
		out = filepath.Join(dir, check.DefaultManifestName)
	}
	exclude := []string{check.DefaultManifestName}
	if out != "-" {
		exclude = manifestExclusions(out, []check.Source{{Dir: dir}})
	}
	m, rep, err := check.InitManifest(c.Context, cfg, check.Source{Dir: dir}, check.InitOptions{
		Model: c.String("model"), Checksums: !c.Bool("no-checksums"), Exclude: exclude,
	})
	if err != nil {
		return err
	}
	if !rep.OK() && !c.Bool("force") {
		if err := rep.WriteText(c.App.ErrWriter); err != nil {
			return err
		}
		return &exitError{code: exitFailed, err: fmt.Errorf("dr manifest init: %s has %d blocking findings: fix them, or pass --force to record the folder as it is", dir, rep.Counts.Blocking)}
	}
	b, err := m.Marshal()
	if err != nil {
		return err
	}
	if out == "-" {
		_, err = c.App.Writer.Write(b)
		return err
	}
	if err := os.WriteFile(out, b, 0o644); err != nil {
		return fmt.Errorf("dr manifest init: %w", err)
	}
	_, err = fmt.Fprintf(c.App.Writer, "wrote %s: %d files (%d blocking, %d warning, %d info findings)\n", out, len(m.Files), rep.Counts.Blocking, rep.Counts.Warning, rep.Counts.Info)
	return err
}
