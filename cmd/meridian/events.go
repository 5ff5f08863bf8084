package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/regional/kvevents"
)

// eventsCommand is `meridian events`: operator tools for the KV-event stream.
// Later subcommands (tail) are passed in as extra.
func eventsCommand(extra ...*cli.Command) *cli.Command {
	return &cli.Command{
		Name:        "events",
		Usage:       "inspect KV-cache events (vLLM KVEventBatch msgpack)",
		Subcommands: append([]*cli.Command{eventsDecodeCommand()}, extra...),
	}
}

func eventsDecodeCommand() *cli.Command {
	return &cli.Command{
		Name:      "decode",
		Usage:     "decode raw vLLM KV event batches and print each as one JSON object per line",
		ArgsUsage: "[FILE|-]",
		Description: "Reads binary msgpack (one payload, or several concatenated) from FILE or standard input,\n" +
			"or with --hex one hex-encoded payload per line. Each payload that cannot be decoded gets a\n" +
			"line on standard error naming its position, the byte offset and the reason; in hex mode the\n" +
			"next line is still decoded. A malformed event inside a payload that decodes is named the same\n" +
			"way (index, tag, reason, offset) and listed under \"skipped\"; the payload's good events are\n" +
			"printed. The exit status is 1 if anything failed.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "hex", Usage: "read one hex-encoded payload per line"},
			&cli.IntFlag{Name: "max-bytes", Value: kvevents.DefaultDecoderConfig().MaxMessageBytes,
				Usage: "largest payload accepted, in bytes"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return usageError("events decode: want at most one FILE, got %d arguments", c.NArg())
			}
			in := c.App.Reader
			if name := c.Args().First(); name != "" && name != "-" {
				f, err := os.Open(name)
				if err != nil {
					return fmt.Errorf("events decode: %w", err)
				}
				defer f.Close()
				in = f
			}
			dcfg := kvevents.DefaultDecoderConfig()
			dcfg.MaxMessageBytes = c.Int("max-bytes")
			if err := dcfg.Validate(); err != nil {
				return usageError("events decode: --max-bytes: %w", err)
			}
			res, err := kvevents.Dump(in, c.App.Writer, c.App.ErrWriter, kvevents.DumpConfig{Hex: c.Bool("hex"), Decoder: dcfg})
			if err != nil {
				return err
			}
			if res.Failed > 0 || res.BadEvents > 0 {
				return fmt.Errorf("events decode: %d payload(s) failed to decode, %d decoded, %d malformed event(s) skipped", res.Failed, res.Batches, res.BadEvents)
			}
			return nil
		},
	}
}
