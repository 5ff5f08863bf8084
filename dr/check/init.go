package check

import (
	"context"
	"fmt"
)

// InitOptions tunes InitManifest.
type InitOptions struct {
	// Model is recorded as the manifest's model; default config.json's
	// _name_or_path, if any.
	Model string
	// Checksums records the SHA-256 of every file (reads every byte).
	Checksums bool
	// Exclude lists folder-relative paths to leave out (the manifest itself).
	Exclude []string
}

// InitManifest checks a folder and builds the manifest that describes it:
// every file with its kind and size, and with Checksums its SHA-256. Files
// of no known role are listed as optional. The report of the check is
// returned too: a manifest should be written only from a folder without
// blocking findings, and the caller decides.
func InitManifest(ctx context.Context, cfg Config, src Source, opt InitOptions) (*Manifest, *Report, error) {
	cfg.Checksums = ChecksumNever
	if opt.Checksums {
		cfg.Checksums = ChecksumAlways
	}
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	fo, err := checkFolder(ctx, cfg, src, nil, opt.Exclude, false)
	if err != nil {
		return nil, nil, fmt.Errorf("manifest init: %w", err)
	}
	rep := &Report{Checksums: cfg.Checksums.String(), Folders: []FolderSummary{fo.summary()}, Findings: fo.f.list}
	rep.finish()
	m := &Manifest{Version: ManifestVersion, Model: opt.Model}
	if m.Model == "" {
		m.Model, _ = str(fo.model.config["_name_or_path"])
	}
	if fo.modelDir != "." {
		m.ModelDir = fo.modelDir
	}
	engines := map[string]bool{}
	for _, e := range fo.engines {
		engines[e.engine] = true
	}
	if len(engines) == 1 {
		for e := range engines {
			m.Engine = e
		}
	}
	if len(fo.engines) > 0 {
		chat := fo.servesChat()
		m.ServesChat = &chat
	}
	for _, p := range fo.paths {
		f := fo.files[p]
		size := f.size
		m.Files = append(m.Files, Entry{Path: p, Kind: f.kind, Size: &size, SHA256: f.sum, Optional: f.kind == KindOther})
	}
	return m, rep, nil
}
