package check

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Report is the result of Run (and of the check InitManifest runs).
type Report struct {
	// Manifest is the manifest file the folders were checked against.
	Manifest string `json:"manifest,omitempty"`
	// Checksums is the checksum mode of the run.
	Checksums  string          `json:"checksums"`
	Folders    []FolderSummary `json:"folders"`
	Comparison *Comparison     `json:"comparison,omitempty"`
	Counts     Counts          `json:"counts"`
	// Findings sorted: blocking first, then by region, path and code.
	Findings []Finding `json:"findings"`
}

// Counts counts findings by severity.
type Counts struct {
	Blocking int `json:"blocking"`
	Warning  int `json:"warning"`
	Info     int `json:"info"`
}

// FolderSummary describes one folder checked.
type FolderSummary struct {
	Region   string `json:"region,omitempty"`
	Dir      string `json:"dir"`
	ModelDir string `json:"model_dir"`
	Files    int    `json:"files"`
	Bytes    int64  `json:"bytes"`
	// Shards and Tensors count the model's safetensors shards whose header
	// was read, and their tensors.
	Shards  int `json:"shards"`
	Tensors int `json:"tensors"`
	// Hashed files were read in full; ChecksumsVerified of them matched the
	// manifest.
	Hashed            int    `json:"hashed"`
	ChecksumsVerified int    `json:"checksums_verified"`
	Engine            string `json:"engine,omitempty"`
	ServesChat        bool   `json:"serves_chat"`
}

func (r *Report) finish() {
	if r.Findings == nil {
		r.Findings = []Finding{}
	}
	slices.SortFunc(r.Findings, compareFindings)
	r.Counts = Counts{}
	for _, f := range r.Findings {
		switch f.Severity {
		case Blocking:
			r.Counts.Blocking++
		case Warning:
			r.Counts.Warning++
		default:
			r.Counts.Info++
		}
	}
}

// plural renders n and the noun, with an s unless n is 1.
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// OK reports whether there is no blocking finding.
func (r *Report) OK() bool { return r.Counts.Blocking == 0 }

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write dr report: %w", err)
	}
	return nil
}

// WriteText writes the human report: what was checked, then the findings
// grouped by severity, each naming its file, then the verdict.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	b.WriteString("DR check")
	if r.Manifest != "" {
		fmt.Fprintf(&b, " against %s", r.Manifest)
	}
	fmt.Fprintf(&b, " (checksums %s)\n", r.Checksums)
	for _, s := range r.Folders {
		b.WriteString("  ")
		if s.Region != "" {
			b.WriteString(s.Region + " ")
		}
		fmt.Fprintf(&b, "%s: %d files, %s", s.Dir, s.Files, byteSize(s.Bytes))
		if s.ModelDir != "." {
			fmt.Fprintf(&b, ", model in %s/", s.ModelDir)
		}
		fmt.Fprintf(&b, ", %s (%s)", plural(s.Shards, "shard"), plural(s.Tensors, "tensor"))
		if s.Engine != "" {
			fmt.Fprintf(&b, ", engine %s", s.Engine)
			if s.ServesChat {
				b.WriteString(" serving chat")
			}
		}
		fmt.Fprintf(&b, ", %d hashed", s.Hashed)
		if r.Manifest != "" {
			fmt.Fprintf(&b, ", %d checksums verified", s.ChecksumsVerified)
		}
		b.WriteString("\n")
	}
	if c := r.Comparison; c != nil {
		fmt.Fprintf(&b, "  compared %s across %s: %d by sha256, %d by size and safetensors header, %d by size only\n",
			plural(c.Files, "file"), strings.Join(c.Regions, ", "), c.ByChecksum, c.ByHeader, c.BySize)
	}
	for _, sev := range []Severity{Blocking, Warning, Info} {
		var group []Finding
		for _, f := range r.Findings {
			if f.Severity == sev {
				group = append(group, f)
			}
		}
		if len(group) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s (%d)\n", strings.ToUpper(sev.String()), len(group))
		for _, f := range group {
			loc := f.Path
			if loc == "" {
				loc = "(folder)"
			}
			if f.Region != "" {
				loc = f.Region + ":" + loc
			}
			fmt.Fprintf(&b, "  %s  [%s]\n      %s\n", loc, f.Code, f.Message)
		}
	}
	verdict := "OK"
	if !r.OK() {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "\n%s: %d blocking, %d warning, %d info\n", verdict, r.Counts.Blocking, r.Counts.Warning, r.Counts.Info)
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("write dr report: %w", err)
	}
	return nil
}

func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
