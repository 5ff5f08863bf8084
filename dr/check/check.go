package check

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/meridian-llm/meridian/dr/check/safetensors"
)

// Source is one copy of a deployment folder.
type Source struct {
	// Region names the copy in a comparison; empty for a single folder.
	Region string
	// Dir is the folder, shown in reports and opened with os.DirFS unless FS
	// is set.
	Dir string
	// FS, when set, is read instead of Dir.
	FS fs.FS
}

// Request is what to check.
type Request struct {
	// Sources: one folder, or two or more region copies to compare.
	Sources []Source
	// Manifest, when set, lists the files every source must hold.
	Manifest *Manifest
	// ManifestPath is shown in the report. When the manifest file lies
	// inside a source folder it is given as Exclude so it is not reported
	// as unlisted.
	ManifestPath string
	// Exclude lists folder-relative paths to leave out of every source.
	Exclude []string
}

// Run runs every check on each source and, with two or more sources,
// compares them. It returns an error only when the request itself cannot be
// run (bad config, unreadable folder, cancelled context); every problem with
// the folders is a Finding in the report.
func Run(ctx context.Context, cfg Config, req Request) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(req.Sources) == 0 {
		return nil, errors.New("dr check: no folder to check")
	}
	regions := make(map[string]bool)
	for _, s := range req.Sources {
		if len(req.Sources) > 1 {
			if s.Region == "" {
				return nil, fmt.Errorf("dr check: folder %s has no region name (compare needs region=DIR)", s.Dir)
			}
			if regions[s.Region] {
				return nil, fmt.Errorf("dr check: region %q given twice", s.Region)
			}
			regions[s.Region] = true
		}
	}
	rep := &Report{Manifest: req.ManifestPath, Checksums: cfg.Checksums.String()}
	folders := make([]*folder, 0, len(req.Sources))
	for _, s := range req.Sources {
		fo, err := checkFolder(ctx, cfg, s, req.Manifest, req.Exclude, len(req.Sources) > 1)
		if err != nil {
			return nil, err
		}
		folders = append(folders, fo)
		rep.Folders = append(rep.Folders, fo.summary())
		rep.Findings = append(rep.Findings, fo.f.list...)
	}
	if len(folders) > 1 {
		cf, sum := compareFolders(folders)
		rep.Findings = append(rep.Findings, cf...)
		rep.Comparison = sum
	}
	rep.finish()
	return rep, nil
}

// file is one regular file of a folder (symlinks followed).
type file struct {
	rel    string
	size   int64
	kind   Kind
	listed bool

	sum    string // hex SHA-256, once hashed
	hdr    *safetensors.Header
	hdrErr error
}

func (f *file) isSafetensors() bool { return strings.HasSuffix(strings.ToLower(f.rel), ".safetensors") }

// folder is the state of one source's check.
type folder struct {
	cfg       Config
	src       Source
	fsys      fs.FS
	man       *Manifest
	entries   map[string]Entry // the manifest's entries by path
	comparing bool

	modelDir    string
	files       map[string]*file
	paths       []string // sorted
	dirs        map[string]bool
	adapterDirs map[string]bool
	f           findings

	docs    map[string]any   // parsed JSON documents by path
	yamls   map[string][]any // parsed YAML documents by path
	texts   map[string][]byte
	model   *modelInfo
	engines []*engineSource

	hashed, verified int
}

func checkFolder(ctx context.Context, cfg Config, src Source, man *Manifest, exclude []string, comparing bool) (*folder, error) {
	fsys := src.FS
	if fsys == nil {
		st, err := os.Stat(src.Dir)
		if err != nil {
			return nil, fmt.Errorf("dr check: %w", err)
		}
		if !st.IsDir() {
			return nil, fmt.Errorf("dr check: %s is not a directory", src.Dir)
		}
		fsys = os.DirFS(src.Dir)
	}
	fo := &folder{
		cfg: cfg, src: src, fsys: fsys, man: man, comparing: comparing,
		files: make(map[string]*file), dirs: map[string]bool{".": true}, adapterDirs: make(map[string]bool),
		docs: make(map[string]any), yamls: make(map[string][]any), texts: make(map[string][]byte),
		f: findings{region: src.Region},
	}
	if man != nil {
		fo.entries = man.byPath()
	}
	if err := fo.scan(ctx, exclude); err != nil {
		return nil, err
	}
	if err := fo.readHeaders(ctx); err != nil {
		return nil, err
	}
	fo.parseAll()
	fo.model = fo.loadModel()
	fo.engines = fo.loadEngines()
	fo.checkWeights()
	fo.checkModelConfig()
	fo.checkTokenizer()
	fo.checkQuantization()
	fo.checkEngines()
	fo.checkLoRA()
	fo.checkDeployment()
	fo.checkManifest()
	if err := fo.checksums(ctx); err != nil {
		return nil, err
	}
	return fo, nil
}

// scan walks the folder, skipping hidden files and directories, following
// file symlinks, and classifies each file.
func (fo *folder) scan(ctx context.Context, exclude []string) error {
	err := fs.WalkDir(fo.fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == "." {
				return err
			}
			fo.f.add(Blocking, CodeFileUnreadable, p, "cannot read: %v", unwrapPathErr(err))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p != "." && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if slices.Contains(exclude, p) {
			return nil
		}
		if d.IsDir() {
			fo.dirs[p] = true
			return nil
		}
		if !d.Type().IsRegular() && d.Type()&fs.ModeSymlink == 0 {
			return nil // sockets, devices
		}
		st, err := fs.Stat(fo.fsys, p)
		if err != nil {
			if d.Type()&fs.ModeSymlink != 0 {
				fo.f.add(Blocking, CodeDanglingSymlink, p, "symlink whose target is missing (a copied cache snapshot without its blobs?)")
			} else {
				fo.f.add(Blocking, CodeFileUnreadable, p, "cannot stat: %v", unwrapPathErr(err))
			}
			return nil
		}
		if st.IsDir() {
			fo.f.add(Info, CodeSymlinkedDir, p, "symlink to a directory: not followed")
			return nil
		}
		fo.files[p] = &file{rel: p, size: st.Size()}
		if path.Base(p) == "adapter_config.json" {
			fo.adapterDirs[path.Dir(p)] = true
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("dr check: scan %s: %w", fo.src.Dir, err)
	}
	for p := range fo.files {
		fo.paths = append(fo.paths, p)
	}
	slices.Sort(fo.paths)
	fo.modelDir = fo.findModelDir()
	for _, p := range fo.paths {
		f := fo.files[p]
		f.kind = classify(p, fo.modelDir, fo.adapterDirs)
		if fo.man != nil {
			if e, ok := fo.entries[p]; ok {
				f.kind, f.listed = e.Kind, true
			}
		}
	}
	return nil
}

// findModelDir returns the manifest's model_dir, else "." when the root has
// config.json, else the single directory holding config.json next to a
// tokenizer or weights, else ".".
func (fo *folder) findModelDir() string {
	if fo.man != nil && fo.man.ModelDir != "" {
		return fo.man.ModelDir
	}
	if fo.files["config.json"] != nil {
		return "."
	}
	var found []string
	for _, p := range fo.paths {
		if path.Base(p) != "config.json" {
			continue
		}
		d := path.Dir(p)
		if fo.adapterDirs[d] {
			continue
		}
		for _, sib := range []string{"tokenizer.json", "tokenizer.model", "tiktoken.model", "model.safetensors", "model.safetensors.index.json"} {
			if fo.files[path.Join(d, sib)] != nil {
				found = append(found, d)
				break
			}
		}
	}
	if len(found) == 1 {
		fo.f.add(Info, CodeModelDirDetected, found[0], "no config.json at the top of the folder: checking the model in %s/", found[0])
		return found[0]
	}
	return "."
}

// inModel joins name onto the model directory.
func (fo *folder) inModel(name string) string { return path.Join(fo.modelDir, name) }

// has reports whether the folder holds the file at p.
func (fo *folder) has(p string) bool { return fo.files[p] != nil }

func unwrapPathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func (fo *folder) summary() FolderSummary {
	s := FolderSummary{Region: fo.src.Region, Dir: fo.src.Dir, ModelDir: fo.modelDir, Files: len(fo.files),
		Hashed: fo.hashed, ChecksumsVerified: fo.verified}
	for _, f := range fo.files {
		s.Bytes += f.size
	}
	for _, f := range fo.modelShards() {
		if f.hdr != nil {
			s.Shards++
			s.Tensors += len(f.hdr.Tensors)
		}
	}
	if len(fo.engines) > 0 {
		var names []string
		for _, e := range fo.engines {
			if !slices.Contains(names, e.engine) {
				names = append(names, e.engine)
			}
		}
		s.Engine = strings.Join(names, ",")
	}
	s.ServesChat = fo.servesChat()
	return s
}
