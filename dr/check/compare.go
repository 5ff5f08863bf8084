package check

import (
	"fmt"
	"slices"
	"strings"
)

// Comparison summarises how the region copies were compared.
type Comparison struct {
	Regions []string `json:"regions"`
	// Files is the number of distinct paths across the regions.
	Files int `json:"files"`
	// ByChecksum files were compared by SHA-256, ByHeader by size and
	// safetensors header, BySize by size only.
	ByChecksum int `json:"by_checksum"`
	ByHeader   int `json:"by_header"`
	BySize     int `json:"by_size"`
}

// compareFolders names every file missing from some region's copy and
// every file whose copies differ.
func compareFolders(folders []*folder) ([]Finding, *Comparison) {
	cmp := &Comparison{}
	union := map[string]bool{}
	for _, fo := range folders {
		cmp.Regions = append(cmp.Regions, fo.src.Region)
		for p := range fo.files {
			union[p] = true
		}
	}
	paths := make([]string, 0, len(union))
	for p := range union {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	cmp.Files = len(paths)
	var out []Finding
	var sev Severity
	add := func(code Code, p, format string, args ...any) {
		out = append(out, Finding{Severity: sev, Code: code, Path: p, Message: fmt.Sprintf(format, args...)})
	}
	for _, p := range paths {
		var have []*folder
		var lack []string
		for _, fo := range folders {
			if fo.files[p] != nil {
				have = append(have, fo)
			} else {
				lack = append(lack, fo.src.Region)
			}
		}
		// A file no role is known for (a README) differing is a warning.
		sev = Blocking
		if have[0].files[p].kind == KindOther {
			sev = Warning
		}
		if len(lack) > 0 {
			add(CodeRegionFileMissing, p, "missing in %s; present in %s", strings.Join(lack, ", "), regionNames(have))
		}
		if len(have) < 2 {
			continue
		}
		files := make([]*file, len(have))
		for i, fo := range have {
			files[i] = fo.files[p]
		}
		if !allSame(files, func(f *file) string { return fmt.Sprint(f.size) }) {
			add(CodeRegionFileDiffers, p, "sizes differ: %s", listBy(have, files, func(f *file) string { return fmt.Sprintf("%d bytes", f.size) }))
			continue
		}
		switch {
		case every(files, func(f *file) bool { return f.sum != "" }):
			cmp.ByChecksum++
			if !allSame(files, func(f *file) string { return f.sum }) {
				add(CodeRegionFileDiffers, p, "same size, different sha256: %s", listBy(have, files, func(f *file) string { return short(f.sum) }))
			}
		case every(files, func(f *file) bool { return f.hdr != nil }):
			cmp.ByHeader++
			if !allSame(files, func(f *file) string { return string(f.hdr.Sum[:]) }) {
				add(CodeRegionFileDiffers, p, "same size, different safetensors headers (other tensors or layout): %s", listBy(have, files, func(f *file) string { return fmt.Sprintf("%d tensors", len(f.hdr.Tensors)) }))
			}
		default:
			cmp.BySize++
		}
	}
	return out, cmp
}

func regionNames(fs []*folder) string {
	names := make([]string, len(fs))
	for i, fo := range fs {
		names[i] = fo.src.Region
	}
	return strings.Join(names, ", ")
}

func allSame(files []*file, key func(*file) string) bool {
	for _, f := range files[1:] {
		if key(f) != key(files[0]) {
			return false
		}
	}
	return true
}

func every(files []*file, ok func(*file) bool) bool {
	return !slices.ContainsFunc(files, func(f *file) bool { return !ok(f) })
}

func listBy(fs []*folder, files []*file, show func(*file) string) string {
	parts := make([]string, len(fs))
	for i := range fs {
		parts[i] = fs[i].src.Region + " " + show(files[i])
	}
	return strings.Join(parts, ", ")
}
