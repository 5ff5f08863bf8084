package check

import (
	"fmt"
	"path"
	"strings"
)

func (fo *folder) checkDeployment() {
	var k8s, docker, locks int
	for _, p := range fo.paths {
		switch fo.files[p].kind {
		case KindDeployment:
			k8s++
			fo.checkKubernetes(p)
		case KindDockerfile:
			docker++
			fo.checkDockerfile(p)
		case KindDependencyLock:
			locks++
			fo.checkLock(p)
		}
	}
	if k8s == 0 && !fo.hasListedKind(KindDeployment) {
		fo.f.add(Warning, CodeDeploymentMissing, "", "no Kubernetes manifest: how the region runs the engine is not part of the copy")
	}
	if docker == 0 && !fo.hasListedKind(KindDockerfile) {
		fo.f.add(Warning, CodeDockerfileMissing, "", "no Dockerfile: the serving image is not part of the copy")
	}
	if locks == 0 && !fo.hasListedKind(KindDependencyLock) {
		fo.f.add(Warning, CodeDependencyLockMissing, "", "no dependency lock (requirements*.txt, uv.lock, poetry.lock, ...): the region may install other engine versions")
	}
}

func (fo *folder) checkKubernetes(p string) {
	for i, doc := range fo.yamls[p] {
		m, ok := doc.(map[string]any)
		if !ok {
			fo.f.add(Blocking, CodeDeploymentInvalid, p, "document %d is not a Kubernetes object", i+1)
			continue
		}
		av, _ := str(m["apiVersion"])
		kind, _ := str(m["kind"])
		if av == "" || kind == "" {
			fo.f.add(Blocking, CodeDeploymentInvalid, p, "document %d lacks apiVersion or kind", i+1)
			continue
		}
		walkContainers(m, func(c map[string]any) {
			img, _ := str(c["image"])
			name, _ := str(c["name"])
			if img != "" && !imagePinned(img) {
				fo.f.add(Warning, CodeImageUnpinned, p, "%s %s container %s uses image %s without a fixed tag or digest: another region may pull a different engine", kind, objName(m), name, img)
			}
		})
	}
}

func objName(m map[string]any) string {
	if md, ok := m["metadata"].(map[string]any); ok {
		if n, ok := str(md["name"]); ok {
			return n
		}
	}
	return "(unnamed)"
}

// imagePinned reports whether an image reference has a digest or a tag other
// than latest.
func imagePinned(ref string) bool {
	if strings.Contains(ref, "@sha256:") {
		return true
	}
	last := ref[strings.LastIndexByte(ref, '/')+1:]
	i := strings.LastIndexByte(last, ':')
	return i >= 0 && last[i+1:] != "" && last[i+1:] != "latest"
}

func (fo *folder) checkDockerfile(p string) {
	b, ok := fo.read(p)
	if !ok {
		return
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	stages := map[string]bool{}
	froms := 0
	for n, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.EqualFold(f[0], "FROM") {
			continue
		}
		froms++
		args := f[1:]
		for len(args) > 0 && strings.HasPrefix(args[0], "--") {
			args = args[1:]
		}
		if len(args) == 0 {
			fo.f.add(Blocking, CodeDockerfileInvalid, p, "line %d: FROM without an image", n+1)
			continue
		}
		img := args[0]
		if len(args) >= 3 && strings.EqualFold(args[1], "AS") {
			stages[strings.ToLower(args[2])] = true
		}
		if img == "scratch" || stages[strings.ToLower(img)] || strings.Contains(img, "$") {
			continue
		}
		if !imagePinned(img) {
			fo.f.add(Warning, CodeImageUnpinned, p, "line %d: FROM %s without a fixed tag or digest: a rebuild in another region may get a different base", n+1, img)
		}
	}
	if froms == 0 {
		fo.f.add(Blocking, CodeDockerfileInvalid, p, "no FROM instruction: not a Dockerfile that builds")
	}
}

// checkLock warns about requirement lines that do not pin an exact version.
func (fo *folder) checkLock(p string) {
	base := strings.ToLower(path.Base(p))
	if !strings.HasSuffix(base, ".txt") && base != "requirements.lock" {
		return // uv.lock, poetry.lock, ...: pinned by construction (TOML, not parsed)
	}
	b, ok := fo.read(p)
	if !ok {
		return
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	var loose []string
	for _, line := range strings.Split(text, "\n") {
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "-") {
			continue
		}
		spec := strings.Fields(line)[0]
		if strings.Contains(spec, "==") || strings.Contains(spec, " @ ") || strings.Contains(line, " @ ") || strings.Contains(spec, "://") {
			continue
		}
		loose = append(loose, spec)
	}
	if len(loose) > 0 {
		fo.f.add(Warning, CodeDependencyUnpinned, p, "%d requirements without an exact == pin: %s", len(loose), sample(loose, 4))
	}
}

// checkManifest compares the folder with the manifest: every listed file
// present with the recorded size, and every unlisted file noted.
func (fo *folder) checkManifest() {
	if fo.man == nil {
		return
	}
	for _, e := range fo.man.Files {
		f := fo.files[e.Path]
		if f == nil {
			sev := Blocking
			if e.Optional {
				sev = Warning
			}
			if fo.f.hasAt(e.Path, CodeDanglingSymlink, CodeFileUnreadable) {
				continue
			}
			fo.f.addOnce(sev, e.Kind.MissingCode(), e.Path, "listed in the manifest (%s) but not in the folder", e.Kind)
			continue
		}
		if e.Size != nil && *e.Size != f.size && !fo.f.hasAt(e.Path, CodeShardTruncated, CodeShardSizeMismatch) {
			fo.f.add(Blocking, CodeSizeMismatch, e.Path, "%d bytes, the manifest records %d%s", f.size, *e.Size, sizeHint(f.size, *e.Size))
		}
	}
	for _, p := range fo.paths {
		if !fo.files[p].listed {
			fo.f.add(Info, CodeFileUnlisted, p, "not in the manifest (kind %s): add it with manifest init if the region needs it", fo.files[p].kind)
		}
	}
}

func sizeHint(got, want int64) string {
	if got < want {
		return fmt.Sprintf(" (%d bytes short: a partial copy?)", want-got)
	}
	return ""
}
