package discovery

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// maxFileBytes bounds the pods file read.
const maxFileBytes = 16 << 20

// File is the source that follows a YAML or JSON file of pods: see
// FileConfig and the package doc.
type File struct {
	*runner
	cfg   FileConfig
	stamp os.FileInfo // of the file last read; nil: none yet
}

// NewFile builds a file source (cfg is validated, zero fields defaulted;
// the file need not exist yet).
func NewFile(cfg FileConfig, deps Deps) (*File, error) {
	cfg = cfg.withDefaults()
	if cfg.Path == "" {
		return nil, errors.New("discovery: file.path is required")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// The file is the truth: a pod it no longer lists leaves at once.
	r, err := newRunner("file", cfg.Path, deps, newTracker(0, 1))
	if err != nil {
		return nil, err
	}
	f := &File{runner: r, cfg: cfg}
	r.lookup = f.lookup
	r.delay = func(answer, error, int) time.Duration { return cfg.Interval }
	return f, nil
}

// Run implements Source.
func (f *File) Run(ctx context.Context, update func(pods []Pod)) error { return f.run(ctx, update) }

// Refresh implements Source: it re-reads the file whether or not it
// changed.
func (f *File) Refresh(ctx context.Context) error { return f.requestRefresh(ctx) }

// lookup reads the file when it changed since the last read (or when
// forced) and parses it. A file that cannot be read or parsed is an error:
// the last good set stands, and the same file is not read again until it
// changes or a refresh asks.
func (f *File) lookup(_ context.Context, force bool) (answer, error) {
	fi, err := os.Stat(f.cfg.Path)
	if err != nil {
		return answer{}, fmt.Errorf("pods file: %w", err)
	}
	if !force && f.stamp != nil && sameStamp(f.stamp, fi) {
		return answer{skipped: true}, nil
	}
	data, stamp, err := readStable(f.cfg.Path)
	if err != nil {
		return answer{}, err
	}
	f.stamp = stamp
	pods, err := ParseFile(f.cfg.Path, data, f.cfg.Model, f.cfg.Profile)
	if err != nil {
		return answer{}, err
	}
	return answer{pods: pods, notFound: len(pods) == 0}, nil
}

// sameStamp reports whether two stats are of the same file, unchanged:
// the same device and inode (a ConfigMap update swaps a symlink), size and
// modification time.
func sameStamp(a, b os.FileInfo) bool {
	return os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}

// readStable reads a file and its stat, failing when the stat changed
// while it was read (a writer not done yet: it is read again at the next
// check).
func readStable(path string) ([]byte, os.FileInfo, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("pods file: %w", err)
	}
	defer fh.Close()
	before, err := fh.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("pods file: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(fh, maxFileBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("pods file: %w", err)
	}
	if len(data) > maxFileBytes {
		return nil, nil, fmt.Errorf("pods file %s: larger than %d bytes", path, maxFileBytes)
	}
	after, err := fh.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("pods file: %w", err)
	}
	if !sameStamp(before, after) {
		return nil, nil, fmt.Errorf("pods file %s: changed while being read", path)
	}
	return data, before, nil
}

// filePod is one pod as the file gives it.
type filePod struct {
	// Name of the pod. Required, unique.
	Name string `yaml:"name"`
	// Endpoint is the base URL of its API, e.g. "http://10.0.3.7:8000".
	// Required.
	Endpoint string `yaml:"endpoint"`
	// Model and Profile; default the source's.
	Model   string `yaml:"model"`
	Profile string `yaml:"profile"`
	// KVEvents and Replay are the engine's ZMQ endpoints
	// (tcp://host:port or ipc://path); optional.
	KVEvents string `yaml:"kv_events"`
	Replay   string `yaml:"replay"`
}

// ParseFile parses a pods file (named path in errors, which give its line):
// a YAML or JSON document that is either a list of pods or a mapping whose
// one key, pods, holds the list. Pods without a model or profile get model
// and profile. An empty document is an error, not zero pods (a file being
// rewritten in place is empty for a moment): "pods: []" or "[]" lists none.
func ParseFile(path string, data []byte, model, profile string) ([]Pod, error) {
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("pods file %s: empty (write \"pods: []\" for no pods)", path)
		}
		return nil, fmt.Errorf("pods file %s: %w", path, err)
	}
	list := doc.Content[0]
	if list.Kind == yaml.MappingNode {
		var pods *yaml.Node
		for i := 0; i+1 < len(list.Content); i += 2 {
			if k := list.Content[i]; k.Value != "pods" {
				return nil, fmt.Errorf("pods file %s:%d: unknown key %q (want pods)", path, k.Line, k.Value)
			}
			pods = list.Content[i+1]
		}
		if pods == nil {
			return nil, fmt.Errorf("pods file %s:%d: no pods key (write \"pods: []\" for no pods)", path, list.Line)
		}
		list = pods
	}
	if list.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("pods file %s:%d: want a list of pods, or a mapping with the key pods", path, list.Line)
	}
	out := make([]Pod, 0, len(list.Content))
	lines := map[string]int{}
	for i, n := range list.Content {
		where := fmt.Sprintf("pods file %s:%d: pods[%d]", path, n.Line, i)
		var fp filePod
		if err := decodeKnown(n, "pod", &fp); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		p, err := fp.pod(model, profile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if line, dup := lines[p.Name]; dup {
			return nil, fmt.Errorf("%s: name %q: also the pod at line %d", where, p.Name, line)
		}
		lines[p.Name] = n.Line
		out = append(out, p)
	}
	return normalise(out), nil
}

// pod checks a file's pod and makes it a Pod.
func (fp filePod) pod(model, profile string) (Pod, error) {
	if fp.Name == "" || len(fp.Name) > 253 || strings.ContainsFunc(fp.Name, func(r rune) bool {
		return unicode.IsSpace(r) || !unicode.IsPrint(r)
	}) {
		return Pod{}, fmt.Errorf("name %q: want 1..253 printable bytes without spaces", fp.Name)
	}
	host, err := httpHost(fp.Endpoint)
	if err != nil {
		return Pod{}, fmt.Errorf("endpoint %q: %w", fp.Endpoint, err)
	}
	for _, z := range []struct{ name, v string }{{"kv_events", fp.KVEvents}, {"replay", fp.Replay}} {
		if err := checkZMQ(z.v); err != nil {
			return Pod{}, fmt.Errorf("%s %q: %w", z.name, z.v, err)
		}
	}
	p := Pod{Name: fp.Name, Endpoint: fp.Endpoint, Model: cmp.Or(fp.Model, model), Profile: cmp.Or(fp.Profile, profile),
		KVEvents: fp.KVEvents, Replay: fp.Replay}
	if a, err := netip.ParseAddr(host); err == nil {
		p.Addr = a.Unmap().WithZone("")
	}
	return p, nil
}

// httpHost checks a base URL prompts may be sent to (http or https, a
// host, no credentials, query or fragment) and returns its host.
func httpHost(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	switch {
	case err != nil:
		return "", err
	case u.Scheme != "http" && u.Scheme != "https":
		return "", errors.New("want an http or https URL")
	case u.Hostname() == "":
		return "", errors.New("no host")
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return "", errors.New("no credentials, query or fragment allowed")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("port %q: want 1..65535", p)
		}
	}
	return u.Hostname(), nil
}

// checkZMQ accepts "" (none), tcp://host:port with a port 1..65535, or
// ipc://path.
func checkZMQ(ep string) error {
	switch {
	case ep == "":
		return nil
	case strings.HasPrefix(ep, "ipc://"):
		if ep == "ipc://" {
			return errors.New("empty ipc path")
		}
		return nil
	case strings.HasPrefix(ep, "tcp://"):
		u, err := url.Parse(ep)
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(u.Port())
		if u.Hostname() == "" || err != nil || n < 1 || n > 65535 || u.Path != "" {
			return errors.New("want tcp://host:port")
		}
		return nil
	}
	return errors.New("want tcp://host:port or ipc://path")
}
