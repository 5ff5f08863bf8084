package main

import (
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/regional"
)

// controllerCommand is `meridian controller`: run one region's controller.
func controllerCommand() *cli.Command {
	return &cli.Command{
		Name:  "controller",
		Usage: "run the controller of one region (Kafka ingestion, block index, routing proxy, decision API)",
		Description: "Reads the YAML configuration given by --config (see regional.Config for every key) and\n" +
			"serves the OpenAI-compatible API on its listen address: POST /v1/chat/completions,\n" +
			"/v1/completions and /v1/route, GET /v1/models, /healthz, /readyz and /metrics.\n" +
			"Flags override the file; ${VAR} in the file is replaced by the environment variable, and the\n" +
			"secrets come from MERIDIAN_ADMIN_TOKEN, MERIDIAN_HOP_TOKEN, MERIDIAN_GOSSIP_KEY and\n" +
			"MERIDIAN_AUDIT_KEY when set. --check validates the configuration, prints every value in\n" +
			"force, defaults included (secrets redacted, sections that are off commented), and exits.\n" +
			"Relative paths in the file are relative to the file's directory.\n\n" +
			"SIGHUP, or a change to the content of the file or of a file it names (every\n" +
			"reload.watch_interval, default 5s), reloads what can change live: policy_file (without\n" +
			"raft), pods.static and pods.allowed_endpoints, the decision section, the API keys or\n" +
			"JWKS file, and the TLS files. A reload is all or nothing: one part that does not load\n" +
			"leaves everything as it was (the error is logged and counted in\n" +
			"meridian_config_reloads_total{result=\"error\"}). Policy and API key changes are recorded\n" +
			"in the audit log first. Other keys take effect at the next start; the reload names them.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "config", Aliases: []string{"c"}, EnvVars: []string{"MERIDIAN_CONFIG"}, Usage: "YAML configuration file"},
			&cli.StringFlag{Name: "region", Usage: "region this controller serves (overrides the file)"},
			&cli.StringFlag{Name: "listen", Usage: "HTTP listen address (overrides the file)"},
			&cli.StringFlag{Name: "kafka", EnvVars: []string{"MERIDIAN_KAFKA"}, Usage: "comma-separated Kafka brokers (overrides the file)"},
			&cli.StringFlag{Name: "controller-id", EnvVars: []string{"MERIDIAN_CONTROLLER_ID"}, Usage: "stable id of this controller (default: host name)"},
			&cli.StringFlag{Name: "public-url", EnvVars: []string{"MERIDIAN_PUBLIC_URL"}, Usage: "URL other controllers forward requests to (overrides the file)"},
			&cli.StringFlag{Name: "admin-url", EnvVars: []string{"MERIDIAN_ADMIN_URL"}, Usage: "URL of this controller's admin API for the others (overrides the file)"},
			&cli.StringFlag{Name: "raft-advertise", EnvVars: []string{"MERIDIAN_RAFT_ADVERTISE"}, Usage: "Raft address the others dial (overrides the file)"},
			&cli.StringFlag{Name: "gossip-advertise", EnvVars: []string{"MERIDIAN_GOSSIP_ADVERTISE"}, Usage: "gossip address the others reach (overrides the file)"},
			&cli.BoolFlag{Name: "check", Usage: "validate the configuration, print it, and exit"},
		}, logFlags()...),
		Action: func(c *cli.Context) error {
			cfg, err := controllerConfig(c)
			if err != nil {
				return err
			}
			if c.Bool("check") {
				out, err := cfg.EffectiveYAML()
				if err != nil {
					return err
				}
				_, err = c.App.Writer.Write(out)
				return err
			}
			log, err := newLogger(c, c.App.ErrWriter)
			if err != nil {
				return err
			}
			// SIGHUP reloads the configuration (the file, then the flags
			// and the environment over it, as at start).
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			return regional.Run(c.Context, cfg, regional.Deps{Logger: log, ConfigFile: c.String("config"), Reload: hup,
				LoadConfig: func() (regional.Config, error) { return controllerConfig(c) }})
		},
	}
}

// controllerConfig loads the file (if any), applies the flags and validates.
func controllerConfig(c *cli.Context) (regional.Config, error) {
	cfg := regional.DefaultConfig()
	if path := c.String("config"); path != "" {
		var err error
		if cfg, err = regional.LoadConfig(path); err != nil {
			return cfg, usageError("controller: %w", err)
		}
	}
	if v := c.String("region"); v != "" {
		cfg.Region = v
	}
	if v := c.String("listen"); v != "" {
		cfg.Listen = v
	}
	if v := c.String("kafka"); v != "" {
		cfg.Kafka.Brokers = strings.Split(v, ",")
	}
	if v := c.String("controller-id"); v != "" {
		cfg.ControllerID = v
	}
	for flag, dst := range map[string]*string{"public-url": &cfg.PublicURL, "admin-url": &cfg.AdminURL,
		"raft-advertise": &cfg.Raft.Advertise, "gossip-advertise": &cfg.Gossip.Advertise} {
		if v := c.String(flag); v != "" {
			*dst = v
		}
	}
	cfg.ApplyEnv(os.Getenv)
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return cfg, usageError("controller: %w", err)
	}
	if _, err := cfg.LoadPolicy(); err != nil {
		return cfg, usageError("controller: %w", err)
	}
	return cfg, nil
}
