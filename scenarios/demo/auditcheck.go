package demo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/scenarios/fleet"
)

// auditReport is the end-of-run check of the audit logs.
type auditReport struct {
	records     int64
	verified    bool
	problems    []string
	checkpoints string // file the Raft checkpoints were exported to
}

// sealAndVerify closes every running controller's audit log, every
// replica of every region (which commits its last checkpoint to Raft),
// waits until the Raft state holds every log's final checkpoint, exports
// the checkpoints to cpFile (JSON lines, the input of `meridian audit
// verify --checkpoints`) and verifies the chains under dir against the
// checkpoints, counting their records. Traffic must have stopped.
func sealAndVerify(ctx context.Context, f *fleet.Fleet, dir, cpFile string) (auditReport, error) {
	rep := auditReport{checkpoints: cpFile}
	final := map[string]uint64{}
	var errs []error
	ctls := f.Controllers()
	for _, c := range ctls {
		l := c.Audit()
		if err := l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("seal audit log of %s: %w", c.ID(), err))
		}
		cp := l.Checkpoint()
		final[cp.Controller] = cp.LastSeq
	}
	if len(ctls) == 0 {
		return rep, errors.New("no controller running")
	}
	st := func() *global.State { return ctls[0].Global().State() }
	complete := func() bool {
		s := st()
		for ctl, seq := range final {
			if seq == 0 {
				continue
			}
			ok := false
			for _, c := range s.Checkpoints(ctl) {
				ok = ok || c.Sequence >= seq
			}
			if !ok {
				return false
			}
		}
		return true
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for !complete() && time.Now().Before(deadline) && ctx.Err() == nil {
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
	}
	allCheckpointed := complete()
	if !allCheckpointed {
		rep.problems = append(rep.problems, "the Raft state does not hold every log's final checkpoint: a cut tail would go unnoticed")
	}
	var cps []audit.Checkpoint
	s := st()
	for _, ctl := range s.CheckpointControllers() {
		for _, c := range s.Checkpoints(ctl) {
			cps = append(cps, c.AuditCheckpoint())
		}
	}
	if err := writeCheckpoints(cpFile, cps); err != nil {
		errs = append(errs, err)
	}

	vr, err := audit.Verify(dir, cps)
	if err != nil {
		errs = append(errs, fmt.Errorf("audit verify: %w", err))
	} else {
		for _, c := range vr.Chains {
			rep.records += int64(c.Records)
		}
		rep.verified = vr.OK() && allCheckpointed
		for _, p := range vr.Problems {
			rep.problems = append(rep.problems, p.String())
		}
	}
	return rep, errors.Join(errs...)
}

func writeCheckpoints(path string, cps []audit.Checkpoint) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("export checkpoints: %w", err)
	}
	w := bufio.NewWriter(f)
	for _, cp := range cps {
		if err := audit.WriteCheckpoint(w, cp); err != nil {
			f.Close()
			return fmt.Errorf("export checkpoints: %w", err)
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("export checkpoints: %w", err)
	}
	return f.Close()
}
