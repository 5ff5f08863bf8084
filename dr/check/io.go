package check

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"sync"

	"github.com/meridian-llm/meridian/dr/check/safetensors"
)

// forEach calls fn(i) for i in [0, n) on at most workers goroutines and
// returns when all calls have returned. It stops handing out work once ctx is
// done and then returns ctx.Err().
func forEach(ctx context.Context, workers, n int, fn func(i int)) error {
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := range next {
				fn(i)
			}
		})
	}
	var err error
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(next)
	wg.Wait()
	return err
}

// readHeaders reads the header of every safetensors file in parallel: 8 + N
// bytes each, never the tensor data.
func (fo *folder) readHeaders(ctx context.Context) error {
	var todo []*file
	for _, p := range fo.paths {
		if f := fo.files[p]; f.isSafetensors() {
			todo = append(todo, f)
		}
	}
	err := forEach(ctx, fo.cfg.Workers, len(todo), func(i int) {
		f := todo[i]
		r, err := fo.fsys.Open(f.rel)
		if err != nil {
			f.hdrErr = err
			return
		}
		defer r.Close()
		f.hdr, f.hdrErr = safetensors.ReadHeader(r, f.size)
	})
	if err != nil {
		return fmt.Errorf("dr check: read shard headers: %w", err)
	}
	for _, f := range todo {
		fo.reportHeader(f)
	}
	return nil
}

// reportHeader turns a shard's header error or size disagreement into a
// finding. A truncated file is told apart from a corrupt header.
func (fo *folder) reportHeader(f *file) {
	sev := Blocking
	if f.kind == KindOther || (f.kind == KindWeights && path.Dir(f.rel) != fo.modelDir && !f.listed) {
		sev = Warning
	}
	err := f.hdrErr
	if err == nil {
		err = f.hdr.CheckSize(f.size)
	}
	if err == nil {
		return
	}
	var se *safetensors.SizeError
	switch {
	case errors.As(err, &se) && se.Truncated():
		fo.f.add(sev, CodeShardTruncated, f.rel, "%v (a partial copy?)", err)
	case errors.As(err, &se):
		fo.f.add(sev, CodeShardSizeMismatch, f.rel, "%v: loaders reject it", err)
	case errors.Is(err, safetensors.ErrHeaderBeyondFile), errors.Is(err, safetensors.ErrTooSmall):
		fo.f.add(sev, CodeShardTruncated, f.rel, "%d bytes: %v (a partial copy?)", f.size, err)
	default:
		fo.f.add(sev, CodeShardHeaderInvalid, f.rel, "%v", unwrapPathErr(err))
	}
}

// wantHash reports whether f is hashed in this run.
func (fo *folder) wantHash(f *file) bool {
	switch fo.cfg.Checksums {
	case ChecksumNever:
		return false
	case ChecksumAlways:
		return true
	}
	if fo.comparing && f.size <= fo.cfg.SmallFileBytes {
		return true
	}
	if fo.man != nil {
		if e, ok := fo.entries[f.rel]; ok && e.SHA256 != "" && (e.Size == nil || *e.Size == f.size) {
			return true
		}
	}
	return false
}

// checksums hashes the files this run needs in parallel and verifies those
// the manifest records.
func (fo *folder) checksums(ctx context.Context) error {
	var todo []*file
	for _, p := range fo.paths {
		if f := fo.files[p]; fo.wantHash(f) {
			todo = append(todo, f)
		}
	}
	errs := make([]error, len(todo))
	err := forEach(ctx, fo.cfg.Workers, len(todo), func(i int) {
		todo[i].sum, errs[i] = fo.hash(ctx, todo[i].rel)
	})
	if err != nil {
		return fmt.Errorf("dr check: checksums: %w", err)
	}
	for i, f := range todo {
		if errs[i] != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("dr check: checksums: %w", ctx.Err())
			}
			fo.f.add(Blocking, CodeFileUnreadable, f.rel, "cannot hash: %v", unwrapPathErr(errs[i]))
			continue
		}
		fo.hashed++
	}
	if fo.man == nil {
		return nil
	}
	if fo.cfg.Checksums == ChecksumNever {
		recorded := 0
		for _, e := range fo.man.Files {
			if e.SHA256 != "" {
				recorded++
			}
		}
		if recorded > 0 {
			fo.f.add(Info, CodeChecksumsSkipped, "", "the manifest records %s; none verified (checksums never): same-size corruption goes unseen", plural(recorded, "checksum"))
		}
		return nil
	}
	for _, e := range fo.man.Files {
		f := fo.files[e.Path]
		if f == nil {
			continue
		}
		switch {
		case e.SHA256 == "":
			if fo.cfg.Checksums == ChecksumAlways {
				fo.f.add(Info, CodeChecksumMissing, e.Path, "the manifest records no sha256 for this file (sha256 here: %s)", f.sum)
			}
		case f.sum == "":
		case f.sum != e.SHA256:
			fo.f.add(Blocking, CodeChecksumMismatch, e.Path, "sha256 %s, the manifest records %s", short(f.sum), short(e.SHA256))
		default:
			fo.verified++
		}
	}
	return nil
}

func short(sum string) string {
	if len(sum) > 16 {
		return sum[:16] + "…"
	}
	return sum
}

// hash returns the hex SHA-256 of the file at p, checking ctx every MiB.
func (fo *folder) hash(ctx context.Context, p string) (string, error) {
	r, err := fo.fsys.Open(p)
	if err != nil {
		return "", err
	}
	defer r.Close()
	h := sha256.New()
	buf := make([]byte, 1<<20)
	for {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		n, err := r.Read(buf)
		h.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
