package audit

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

const (
	segmentExt = ".jsonl"
	indexExt   = ".idx"
	tornExt    = ".torn"
	seqDigits  = 20
)

// SegmentName is the file name of the segment whose first record has seq.
func SegmentName(firstSeq uint64) string {
	return fmt.Sprintf("%0*d%s", seqDigits, firstSeq, segmentExt)
}

// parseSegmentName returns the first seq a segment's name promises.
func parseSegmentName(name string) (uint64, bool) {
	base, ok := strings.CutSuffix(name, segmentExt)
	if !ok || len(base) != seqDigits {
		return 0, false
	}
	n, err := strconv.ParseUint(base, 10, 64)
	return n, err == nil && n > 0
}

func indexName(segment string) string {
	return strings.TrimSuffix(segment, segmentExt) + indexExt
}

type segFile struct {
	name  string
	first uint64 // from the name
	size  int64
}

// listSegments returns the segment files of one controller directory in the
// order of their names (first seq). Other files are ignored.
func listSegments(dir string) ([]segFile, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []segFile
	for _, e := range ents {
		first, ok := parseSegmentName(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return nil, err
		}
		out = append(out, segFile{name: e.Name(), first: first, size: info.Size()})
	}
	slices.SortFunc(out, func(a, b segFile) int { return cmp.Compare(a.first, b.first) })
	return out, nil
}

// listChains returns the controller directories under root: root's
// subdirectories holding segments, or root itself if it holds segments (a
// single controller's directory, named by its base name).
func listChains(root string) ([]chainDir, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out []chainDir
	direct := false
	for _, e := range ents {
		if _, ok := parseSegmentName(e.Name()); ok && e.Type().IsRegular() {
			direct = true
			continue
		}
		if !e.IsDir() || !validControllerID(e.Name()) {
			continue
		}
		segs, err := listSegments(filepath.Join(root, e.Name()))
		if err != nil {
			return nil, err
		}
		if len(segs) > 0 {
			out = append(out, chainDir{controller: e.Name(), dir: filepath.Join(root, e.Name())})
		}
	}
	if direct {
		abs, err := filepath.Abs(root)
		if err != nil {
			return nil, err
		}
		return []chainDir{{controller: filepath.Base(abs), dir: root}}, nil
	}
	return out, nil
}

type chainDir struct {
	controller string
	dir        string
}

// indexEntry is one line of a segment's sparse index. A seal line (Seal
// true) is written when the segment is closed: Seq, TS and Hash are the last
// record's, Off is the segment size and Count its number of records.
type indexEntry struct {
	Seq   uint64 `json:"seq"`
	TS    int64  `json:"ts"` // unix nanoseconds
	Off   int64  `json:"off"`
	Seal  bool   `json:"seal,omitempty"`
	Count uint64 `json:"count,omitempty"`
	Hash  string `json:"hash,omitempty"`
}

func appendIndexEntry(b []byte, e indexEntry) []byte {
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, e.Seq, 10)
	b = append(b, `,"ts":`...)
	b = strconv.AppendInt(b, e.TS, 10)
	b = append(b, `,"off":`...)
	b = strconv.AppendInt(b, e.Off, 10)
	if e.Seal {
		b = append(b, `,"seal":true,"count":`...)
		b = strconv.AppendUint(b, e.Count, 10)
		b = append(b, `,"hash":`...)
		b = appendString(b, e.Hash)
	}
	return append(b, '}', '\n')
}

// readIndex reads a segment's sparse index. It stops at the first line that
// is not a valid entry or does not advance (the index is advisory: a torn or
// damaged tail only makes readers scan more). A missing file is no entries.
func readIndex(path string) (entries []indexEntry, seal *indexEntry) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		var e indexEntry
		if json.Unmarshal(b[:i], &e) != nil {
			break
		}
		b = b[i+1:]
		if e.Seal {
			s := e
			seal = &s
			break
		}
		if n := len(entries); n > 0 && (e.Seq <= entries[n-1].Seq || e.Off <= entries[n-1].Off || e.TS < entries[n-1].TS) {
			break
		}
		entries = append(entries, e)
	}
	return entries, seal
}

// lineReader reads the complete lines of a segment from an offset.
type lineReader struct {
	f     *os.File
	r     *bufio.Reader
	off   int64 // offset of the next line
	limit int64 // stop at this offset (< 0: no limit)
	buf   []byte
}

func openLines(path string, off, limit int64) (*lineReader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if off > 0 {
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			f.Close()
			return nil, err
		}
	}
	return &lineReader{f: f, r: bufio.NewReaderSize(f, 64<<10), off: off, limit: limit}, nil
}

// next returns the next complete line without its newline and its offset.
// At the end, or at an incomplete last line, it returns io.EOF; torn is the
// incomplete tail, if any.
func (lr *lineReader) next() (line []byte, off int64, torn []byte, err error) {
	if lr.limit >= 0 && lr.off >= lr.limit {
		return nil, lr.off, nil, io.EOF
	}
	lr.buf = lr.buf[:0]
	for {
		chunk, err := lr.r.ReadSlice('\n')
		lr.buf = append(lr.buf, chunk...)
		if err == nil {
			break
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err == io.EOF {
			return nil, lr.off, lr.buf, io.EOF
		}
		return nil, lr.off, nil, err
	}
	off = lr.off
	lr.off += int64(len(lr.buf))
	if lr.limit >= 0 && lr.off > lr.limit {
		// A line that straddles the limit is not committed yet.
		return nil, off, nil, io.EOF
	}
	return lr.buf[:len(lr.buf)-1], off, nil, nil
}

func (lr *lineReader) close() error { return lr.f.Close() }
