package kvevents

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
)

// DumpConfig configures Dump.
type DumpConfig struct {
	// Hex reads one hex-encoded payload per line (whitespace inside a line
	// ignored; empty lines and lines starting with # skipped) instead of
	// binary msgpack.
	Hex bool
	// Decoder bounds each payload. Default DefaultDecoderConfig().
	Decoder DecoderConfig
}

// DumpResult counts what Dump did.
type DumpResult struct {
	Batches int // decoded and written
	Failed  int // payloads (hex lines) that could not be decoded
	// BadEvents counts malformed events skipped inside decoded batches
	// (their batches are written without them).
	BadEvents int
}

// Dump is `meridian events decode`: it reads raw vLLM batch payloads from in
// and writes each batch as one JSON object per line (AppendJSON) to out. Each
// payload it cannot decode gets one line on errw naming its position, the
// byte offset and the reason; so does each malformed event inside a batch
// that decodes (the batch is written with its good events, the bad one
// listed under "skipped"). Binary input is one payload or several
// concatenated; after a bad one the rest cannot be framed, so Dump stops
// there. Hex input continues with the next line. The error is for I/O only.
func Dump(in io.Reader, out, errw io.Writer, cfg DumpConfig) (DumpResult, error) {
	if cfg.Decoder == (DecoderConfig{}) {
		cfg.Decoder = DefaultDecoderConfig()
	}
	d, err := NewDecoder(cfg.Decoder)
	if err != nil {
		return DumpResult{}, err
	}
	w := bufio.NewWriter(out)
	var res DumpResult
	if cfg.Hex {
		err = dumpHex(d, in, w, errw, &res)
	} else {
		err = dumpBinary(d, in, w, errw, &res)
	}
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	return res, err
}

// maxDumpInput bounds binary input read into memory.
const maxDumpInput = 1 << 30

func dumpBinary(d *Decoder, in io.Reader, w *bufio.Writer, errw io.Writer, res *DumpResult) error {
	data, err := io.ReadAll(io.LimitReader(in, maxDumpInput+1))
	if err != nil {
		return fmt.Errorf("events decode: read: %w", err)
	}
	if len(data) > maxDumpInput {
		return fmt.Errorf("events decode: input larger than %d bytes", maxDumpInput)
	}
	var line []byte
	for off, n := 0, 1; off < len(data); n++ {
		b, used, err := d.DecodePrefix(data[off:])
		if err != nil {
			res.Failed++
			var de *DecodeError
			if errors.As(err, &de) {
				fmt.Fprintf(errw, "payload %d at file byte %d: %s at byte %d (file byte %d): %s; the rest of the input cannot be framed\n",
					n, off, de.Reason, de.Offset, off+de.Offset, de.Detail)
			} else {
				fmt.Fprintf(errw, "payload %d at file byte %d: %v\n", n, off, err)
			}
			return nil
		}
		line = append(AppendJSON(line[:0], b), '\n')
		if _, err := w.Write(line); err != nil {
			return fmt.Errorf("events decode: write: %w", err)
		}
		res.Batches++
		reportBadEvents(errw, fmt.Sprintf("payload %d at file byte %d", n, off), off, b, res)
		off += used
	}
	return nil
}

func dumpHex(d *Decoder, in io.Reader, w *bufio.Writer, errw io.Writer, res *DumpResult) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), 2*d.cfg.MaxMessageBytes+4096)
	var line, raw []byte
	n := 0
	for sc.Scan() {
		n++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 || text[0] == '#' {
			continue
		}
		compact := bytes.Join(bytes.Fields(text), nil)
		var err error
		if raw, err = hex.AppendDecode(raw[:0], compact); err != nil {
			res.Failed++
			fmt.Fprintf(errw, "line %d: bad hex: %v\n", n, err)
			continue
		}
		b, err := d.Decode(raw)
		if err != nil {
			res.Failed++
			var de *DecodeError
			if errors.As(err, &de) {
				fmt.Fprintf(errw, "line %d: %s at byte %d: %s\n", n, de.Reason, de.Offset, de.Detail)
			} else {
				fmt.Fprintf(errw, "line %d: %v\n", n, err)
			}
			continue
		}
		line = append(AppendJSON(line[:0], b), '\n')
		if _, err := w.Write(line); err != nil {
			return fmt.Errorf("events decode: write: %w", err)
		}
		res.Batches++
		reportBadEvents(errw, fmt.Sprintf("line %d", n), 0, b, res)
	}
	if err := sc.Err(); err != nil {
		res.Failed++
		fmt.Fprintf(errw, "line %d: %v (longer than twice the message size limit?)\n", n+1, err)
	}
	return nil
}

// reportBadEvents names each malformed event of b on errw (where says which
// payload; base is the payload's file offset, 0 for hex lines).
func reportBadEvents(errw io.Writer, where string, base int, b *Batch, res *DumpResult) {
	for _, s := range b.Skipped {
		if !s.Malformed() {
			continue
		}
		res.BadEvents++
		tag := s.Tag
		if tag == "" {
			tag = "(no tag)"
		}
		if base > 0 {
			fmt.Fprintf(errw, "%s: event %d (%s) skipped: %s at byte %d (file byte %d): %s\n", where, s.Index, tag, s.Reason, s.ErrOffset, base+s.ErrOffset, s.Detail)
		} else {
			fmt.Fprintf(errw, "%s: event %d (%s) skipped: %s at byte %d: %s\n", where, s.Index, tag, s.Reason, s.ErrOffset, s.Detail)
		}
	}
}
