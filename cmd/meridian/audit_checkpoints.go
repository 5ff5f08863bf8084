package main

import (
	"bufio"
	"fmt"
	"maps"
	"slices"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/audit"
)

// auditCheckpointsCommand builds "meridian audit checkpoints export": the
// audit checkpoints committed in Raft, written as the JSON lines that
// "audit verify --checkpoints" reads, so a copy kept away from the cluster
// can check the logs later (or somewhere the admin API is not reachable).
func auditCheckpointsCommand() *cli.Command {
	return &cli.Command{
		Name:  "checkpoints",
		Usage: "export the audit checkpoints committed in Raft",
		Subcommands: []*cli.Command{{
			Name:  "export",
			Usage: "print the Raft tier's audit checkpoints as JSON lines, the format audit verify --checkpoints reads",
			Description: "meridian audit checkpoints export --admin URL > checkpoints.jsonl\n" +
				"meridian audit verify --dir DIR --checkpoints checkpoints.jsonl\n\n" +
				"Reads on the Raft leader, so the export holds every checkpoint committed when it ran: the\n" +
				"latest " + fmt.Sprint(global.CheckpointsKept) + " of each controller, controllers in name order, each oldest first.",
			Flags: append(adminConnFlags(),
				&cli.StringFlag{Name: "controller-id", Usage: "only the checkpoints of controller `ID`"},
			),
			Action: runAuditCheckpointsExport,
		}},
	}
}

func runAuditCheckpointsExport(c *cli.Context) error {
	cl, ctx, cancel, err := globalClient(c)
	if err != nil {
		return err
	}
	defer cancel()
	l, err := cl.Checkpoints(ctx, c.String("controller-id"), global.ReadOptions{Consistent: true})
	if err != nil {
		return globalError(c, err)
	}
	cps := raftCheckpoints(l)
	if len(cps) == 0 {
		return fmt.Errorf("%s: the Raft state holds no audit checkpoints (do the controllers have audit.dir set?)", cmdPath(c))
	}
	w := bufio.NewWriter(c.App.Writer)
	for _, cp := range cps {
		if err := audit.WriteCheckpoint(w, cp); err != nil {
			return fmt.Errorf("%s: %w", cmdPath(c), err)
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("%s: %w", cmdPath(c), err)
	}
	fmt.Fprintf(c.App.ErrWriter, "%d checkpoints of %d controllers (Raft state index %d)\n", len(cps), len(l.Checkpoints), l.StateIndex)
	return nil
}

// raftCheckpoints converts the Raft tier's checkpoint list to the audit
// package's form: controllers in name order, each one's oldest first.
func raftCheckpoints(l global.CheckpointList) []audit.Checkpoint {
	var out []audit.Checkpoint
	for _, ctl := range slices.Sorted(maps.Keys(l.Checkpoints)) {
		for _, c := range l.Checkpoints[ctl] {
			out = append(out, c.AuditCheckpoint())
		}
	}
	return out
}
