package main

import (
	"os"
	"strings"

	"github.com/urfave/cli/v2"
	"go.yaml.in/yaml/v3"

	"github.com/meridian-llm/meridian/regional/kvbridge"
	"github.com/meridian-llm/meridian/regional/kvevents"
)

// kvBridgeCommand is `meridian kv-bridge`: vLLM's ZMQ KV events to Kafka.
func kvBridgeCommand() *cli.Command {
	return &cli.Command{
		Name:  "kv-bridge",
		Usage: "forward KV-cache events from vLLM engines' ZMQ sockets to the region's Kafka topic",
		Description: "Subscribes to each engine's ZMQ PUB socket (vLLM's --kv-events-config endpoint; frames\n" +
			"[topic, seq, payload]) and writes every batch, unchanged, to meridian.kv-events.<region>\n" +
			"keyed by pod name, with pod, model, hardware and seq headers. Sequence gaps are repaired\n" +
			"through the engine's replay socket (replay_endpoint) when one is given; an engine restart\n" +
			"is forwarded as an AllBlocksCleared marker before the new process's batches.\n\n" +
			"Pods come from --config (YAML, see kvbridge.Config) and/or repeated --pod flags:\n" +
			"  --pod NAME=tcp://HOST:5557[,replay=tcp://HOST:5558][,model=M][,hardware=H][,dp=N][,subscribe=PREFIX]\n" +
			"  --pod tcp://*:5557,bind    (listen for engines that connect; pod names from topics kv@<pod>@<model>)\n" +
			"An empty NAME takes pod names from the topics; with http=URL the bridge announces the pod\n" +
			"(PodUp with that endpoint, repeated every --announce-interval), which vLLM never does.\n\n" +
			"Or the engines are discovered (the file's discovery section, or --dns): a headless Service's\n" +
			"pods, each subscribed to at its address and --kv-events-port, announced with its HTTP\n" +
			"endpoint (the Service's \"http\" port), and dropped when it leaves. Give the controllers the\n" +
			"same discovery section.\n\n" +
			"The file's kafka section (tls, sasl: as a controller's) or the --kafka-* flags secure the\n" +
			"brokers; a broker beyond loopback without TLS needs insecure: true (--kafka-insecure). Flags\n" +
			"override the file; --check prints the effective configuration and exits.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "config", Aliases: []string{"c"}, EnvVars: []string{"MERIDIAN_KVBRIDGE_CONFIG"}, Usage: "YAML configuration file"},
			&cli.GenericFlag{Name: "pod", Value: &podFlags{}, Usage: "an engine to subscribe to (repeatable; syntax above)"},
			&cli.StringFlag{Name: "kafka", EnvVars: []string{"MERIDIAN_KAFKA"}, Usage: "comma-separated Kafka brokers (overrides the file)"},
			&cli.StringFlag{Name: "region", Usage: "region, naming the topic meridian.kv-events.<region> (overrides the file)"},
			&cli.StringFlag{Name: "topic", Usage: "Kafka topic (default meridian.kv-events.<region>)"},
			&cli.StringFlag{Name: "metrics-addr", Usage: "serve /metrics, /healthz, /readyz and /streams on this address"},
			&cli.StringFlag{Name: "dns", Usage: "discover the engines through this headless Service's SRV records (e.g. vllm.ns.svc.cluster.local.)"},
			&cli.IntFlag{Name: "kv-events-port", Value: 5557, Usage: "with --dns: the engines' ZMQ PUB port"},
			&cli.IntFlag{Name: "replay-port", Usage: "with --dns: the engines' ZMQ replay port (0: none)"},
			&cli.StringFlag{Name: "model", Usage: "with --dns: the model the discovered engines serve"},
			&cli.DurationFlag{Name: "announce-interval", Usage: "how often pods are announced (default 10s; negative: never)"},
			&cli.BoolFlag{Name: "check", Usage: "validate the configuration, print it, and exit"},
		}, append(kafkaSecurityFlags(), logFlags()...)...),
		Action: func(c *cli.Context) error {
			cfg, err := kvBridgeConfig(c)
			if err != nil {
				return err
			}
			if c.Bool("check") {
				// Every value in force, as the controller's --check:
				// discovery's defaults filled in.
				eff := cfg
				if eff.Discovery.Enabled() {
					eff.Discovery = eff.Discovery.WithDefaults()
				}
				out, err := yaml.Marshal(eff)
				if err != nil {
					return err
				}
				_, err = c.App.Writer.Write(out)
				return err
			}
			if cfg.Logger, err = newLogger(c, c.App.ErrWriter); err != nil {
				return err
			}
			return kvbridge.Run(c.Context, cfg)
		},
	}
}

// kvBridgeConfig loads the file (if any), applies the flags and validates.
func kvBridgeConfig(c *cli.Context) (kvbridge.Config, error) {
	cfg := kvbridge.DefaultConfig()
	if path := c.String("config"); path != "" {
		var err error
		if cfg, err = kvbridge.LoadConfig(path); err != nil {
			return cfg, usageError("kv-bridge: %w", err)
		}
	}
	if pods, ok := c.Generic("pod").(*podFlags); ok {
		cfg.Pods = append(cfg.Pods, pods.pods...)
	}
	if v := c.String("kafka"); v != "" {
		cfg.Brokers = strings.Split(v, ",")
	}
	if v := c.String("region"); v != "" {
		cfg.Region = v
	}
	if v := c.String("topic"); v != "" {
		cfg.Topic = v
	}
	if v := c.String("metrics-addr"); v != "" {
		cfg.MetricsAddr = v
	}
	cfg.Kafka = kafkaSecurity(c, cfg.Kafka)
	if c.Bool("kafka-insecure") {
		cfg.Insecure = true
	}
	if v := c.String("dns"); v != "" {
		cfg.Discovery.DNS.Name = v
		if cfg.Discovery.DNS.KVEventsPort == 0 || c.IsSet("kv-events-port") {
			cfg.Discovery.DNS.KVEventsPort = c.Int("kv-events-port")
		}
		if c.IsSet("replay-port") {
			cfg.Discovery.DNS.ReplayPort = c.Int("replay-port")
		}
		if v := c.String("model"); v != "" {
			cfg.Discovery.DNS.Model = v
		}
	}
	if c.IsSet("announce-interval") {
		cfg.AnnounceInterval = c.Duration("announce-interval")
	}
	if v := os.Getenv("MERIDIAN_ANNOUNCE_KEY"); v != "" {
		cfg.AnnounceKey = v
	}
	if cfg.Topic == "" && cfg.Region != "" {
		cfg.Topic = kvevents.TopicFor(cfg.Region)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageError("kv-bridge: %w", err)
	}
	return cfg, nil
}

// podFlags collects repeated --pod values. It is a flag.Value of its own
// because a string slice flag would split each value at its commas.
type podFlags struct {
	pods []kvbridge.PodConfig
	raw  []string
}

func (p *podFlags) Set(s string) error {
	pc, err := kvbridge.ParsePodFlag(s)
	if err != nil {
		return err
	}
	p.pods = append(p.pods, pc)
	p.raw = append(p.raw, s)
	return nil
}

func (p *podFlags) String() string { return strings.Join(p.raw, " ") }
