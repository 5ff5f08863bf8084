package sim

import (
	"context"
	"fmt"
	"io"
	"os"
)

// Output says where Execute writes.
type Output struct {
	Stdout io.Writer // the table, or the JSON rows with JSON
	JSON   bool      // write the JSON rows (one array; {"runs": [...]} for a sweep) instead of the table
	Charts string    // directory for the SVG charts and report.json; "" for none
	Report string    // file for the self-contained HTML report; "" for none
	Stderr io.Writer // the progress bar; nil for none
}

// Execute runs the simulation and writes its report: the command `meridian
// sim`. With sweep nil it is one run (Run); otherwise every load and seed
// of sweep (Sweep).
func Execute(ctx context.Context, cfg Config, sweep *SweepConfig, out Output) error {
	opts := Options{Progress: out.Stderr}
	if sweep != nil {
		rep, err := Sweep(ctx, cfg, *sweep, opts)
		if err != nil {
			return err
		}
		if out.Charts != "" {
			if err := rep.WriteCharts(out.Charts); err != nil {
				return fmt.Errorf("sim: %w", err)
			}
		}
		if out.Report != "" {
			if err := writeFile(out.Report, rep.WriteHTML); err != nil {
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
	rep, err := Run(ctx, cfg, opts)
	if err != nil {
		return err
	}
	if out.Charts != "" {
		if err := rep.WriteCharts(out.Charts); err != nil {
			return fmt.Errorf("sim: %w", err)
		}
	}
	if out.Report != "" {
		params := cfg.params(SweepConfig{Seeds: 1})
		if err := writeFile(out.Report, func(w io.Writer) error { return rep.WriteHTML(w, params) }); err != nil {
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

// writeFile creates path and writes it with write.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
