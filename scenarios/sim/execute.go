package sim

import (
	"context"
	"fmt"
	"io"
)

// Output says where Execute writes.
type Output struct {
	Stdout io.Writer // the table, or the JSON rows with JSON
	JSON   bool      // write Report.Rows as one JSON array instead of the table
	Charts string    // directory for the SVG charts and report.json; "" for none
	Stderr io.Writer // the progress bar; nil for none
}

// Execute runs the simulation (Run) and writes its report: the command
// `meridian sim`.
func Execute(ctx context.Context, cfg Config, out Output) error {
	rep, err := Run(ctx, cfg, Options{Progress: out.Stderr})
	if err != nil {
		return err
	}
	if out.Charts != "" {
		if err := rep.WriteCharts(out.Charts); err != nil {
			return fmt.Errorf("sim: %w", err)
		}
	}
	if out.JSON {
		err = rep.WriteJSON(out.Stdout)
	} else {
		err = rep.WriteTable(out.Stdout)
	}
	if err != nil {
		return fmt.Errorf("sim: write report: %w", err)
	}
	return nil
}
