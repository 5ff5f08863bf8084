package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/regional/kafkasec"
	"github.com/meridian-llm/meridian/regional/kvevents"
	"github.com/meridian-llm/meridian/regional/tokenize"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

// engineSimCommand is `meridian engine-sim`: one simulated vLLM pod.
func engineSimCommand() *cli.Command {
	d := enginesim.DefaultConfig()
	return &cli.Command{
		Name:  "engine-sim",
		Usage: "run a simulated vLLM, SGLang or TensorRT-LLM pod (OpenAI API, prefix cache, KV events to Kafka or ZMQ, engine metrics)",
		Description: "Serves POST /v1/completions and /v1/chat/completions (SSE with stream: true), GET /v1/models,\n" +
			"/health and /metrics, POST /reset_prefix_cache, GET/POST /admin/faults and POST\n" +
			"/admin/faults/release. With --kafka it publishes its KV events (vLLM msgpack batches,\n" +
			"key = pod name) to meridian.kv-events.<region>, with PodUp at start and PodDown at exit;\n" +
			"--kafka-ca and --kafka-sasl-* reach brokers that require TLS and SCRAM, and a broker beyond\n" +
			"loopback without TLS needs --kafka-insecure. --tls-cert/--tls-key serve https.\n" +
			"Give the router the same --tokenizer, --model-dir and --chat-template so both compute the\n" +
			"same token ids. Timing defaults come from --hardware; see the enginesim package docs.\n" +
			"--engine vllm|sglang|trtllm chooses whose wire form its KV events take (vLLM's extra_keys salt,\n" +
			"SGLang's cache_salt and signed hashes, TensorRT-LLM's saltless events) and whose metric names\n" +
			"/metrics has; the PodUp says which, so a mixed fleet runs from one binary.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "addr", Value: "127.0.0.1:8000", Usage: "listen address (port 0 picks one)"},
			&cli.StringFlag{Name: "name", Usage: "pod name, the Kafka key of its events (default enginesim-<port>)"},
			&cli.StringFlag{Name: "endpoint", Usage: "base URL announced in PodUp (default http://<listen address>)"},
			&cli.StringFlag{Name: "region", Usage: "region announced in PodUp; names the default Kafka topic"},
			&cli.StringFlag{Name: "model", Value: d.Model, Usage: "served model name"},
			&cli.StringFlag{Name: "engine", Value: kvevents.EngineVLLM, Usage: "engine imitated on the wire and in /metrics: " + strings.Join(kvevents.Engines(), ", ")},
			&cli.StringSliceFlag{Name: "lora", Usage: "LoRA adapter name also served (repeatable)"},
			&cli.StringFlag{Name: "tokenizer", Value: d.Tokenizer.Encoding, Usage: "tiktoken encoding: " + strings.Join(tokenize.Encodings(), ", ")},
			&cli.StringFlag{Name: "model-dir", Usage: "model directory with tokenizer_config.json and/or chat_template.jinja"},
			&cli.StringFlag{Name: "chat-template", Usage: "file holding a Jinja chat template (overrides --model-dir's)"},
			&cli.StringFlag{Name: "hardware", Value: d.Hardware, Usage: "hardware profile: b200, h200 or h100"},
			&cli.IntFlag{Name: "cache-blocks", Usage: "KV-cache capacity in blocks (default: the profile's)"},
			&cli.IntFlag{Name: "block-size", Value: d.BlockSize, Usage: "tokens per KV block"},
			&cli.IntFlag{Name: "max-concurrency", Usage: "requests running at once, vLLM max_num_seqs (default: the profile's)"},
			&cli.IntFlag{Name: "max-model-len", Value: d.MaxModelLen, Usage: "largest prompt plus output, in tokens"},
			&cli.IntFlag{Name: "default-max-tokens", Value: d.DefaultMaxTokens, Usage: "output tokens when a request gives no max_tokens"},
			&cli.Float64Flag{Name: "time-scale", Value: 1, Usage: "multiply every modelled duration (0.01 = 100x faster)"},
			&cli.DurationFlag{Name: "prefill-overhead", Usage: "fixed part of TTFT (default: the profile's)"},
			&cli.DurationFlag{Name: "prefill-per-token", Usage: "prefill time per uncached prompt token (default: the profile's)"},
			&cli.DurationFlag{Name: "decode-interval", Usage: "time between output tokens (default: the profile's)"},
			&cli.Float64Flag{Name: "load-factor", Value: 1, Usage: "times grow linearly up to this factor at max concurrency"},
			&cli.StringFlag{Name: "hash-seed", Usage: "engine hash seed, like PYTHONHASHSEED (default: random per start)"},
			&cli.StringFlag{Name: "kafka", Aliases: []string{"kafka-brokers"}, Usage: "comma-separated Kafka brokers; empty = no publishing"},
			&cli.StringFlag{Name: "zmq-endpoint", Usage: "publish KV events over ZMQ PUB as vLLM does, e.g. tcp://*:5557 (instead of Kafka; feed meridian kv-bridge)"},
			&cli.StringFlag{Name: "zmq-replay", Usage: "ZMQ ROUTER endpoint answering replay requests, e.g. tcp://*:5558"},
			&cli.StringFlag{Name: "kafka-topic", Usage: "Kafka topic (default meridian.kv-events.<region>)"},
			&cli.IntFlag{Name: "event-batch-size", Value: d.EventBatchSize, Usage: "publish once this many events are pending"},
			&cli.DurationFlag{Name: "event-flush-interval", Value: d.EventFlushInterval, Usage: "publish pending events at most this late"},
			&cli.Float64Flag{Name: "error-rate", Usage: "fraction of requests answered with HTTP 500"},
			&cli.Float64Flag{Name: "stall-rate", Usage: "fraction of requests that hang before their first byte"},
			&cli.DurationFlag{Name: "stall-for", Usage: "how long a stall lasts (0 = until POST /admin/faults/release)"},
			&cli.Float64Flag{Name: "die-rate", Usage: "fraction of requests whose connection is cut"},
			&cli.IntFlag{Name: "die-after-chunks", Usage: "SSE chunks a dying stream sends first"},
			&cli.Uint64Flag{Name: "seed", Value: d.Seed, Usage: "seed of fault draws and output text"},
			&cli.StringFlag{Name: "admin-token", EnvVars: []string{"MERIDIAN_ENGINESIM_ADMIN_TOKEN"},
				Usage: "bearer token required on /admin/* and /reset_prefix_cache"},
			&cli.StringFlag{Name: "tls-cert", Usage: "PEM `FILE` of a certificate: serve https (the default --endpoint is then https://)"},
			&cli.StringFlag{Name: "tls-key", Usage: "PEM `FILE` of the certificate's key"},
		}, append(kafkaSecurityFlags(), logFlags()...)...),
		Action: func(c *cli.Context) error {
			if c.String("zmq-endpoint") != "" && c.String("kafka") != "" {
				return usageError("engine-sim: --zmq-endpoint and --kafka exclude each other")
			}
			cfg, err := engineSimConfig(c)
			if err != nil {
				return usageError("engine-sim: %w", err)
			}
			if err := cfg.Validate(); err != nil {
				return usageError("engine-sim: %w", err)
			}
			if ep := c.String("zmq-endpoint"); ep != "" {
				pub, err := enginesim.NewZMQPublisher(enginesim.ZMQConfig{Endpoint: ep, ReplayEndpoint: c.String("zmq-replay"), Model: cfg.Model,
					Encoding: enginesim.EncodingFor(cfg.Engine)})
				if err != nil {
					return usageError("engine-sim: --zmq-endpoint: %w", err)
				}
				defer pub.Close() // after the engine, which publishes its last events on Close
				cfg.Publisher = pub
			}
			return enginesim.Run(c.Context, cfg)
		},
	}
}

func engineSimConfig(c *cli.Context) (enginesim.Config, error) {
	log, err := newLogger(c, c.App.ErrWriter)
	if err != nil {
		return enginesim.Config{}, err
	}
	cfg := enginesim.DefaultConfig()
	cfg.Logger = log
	cfg.Addr = c.String("addr")
	cfg.Name = c.String("name")
	cfg.Endpoint = c.String("endpoint")
	cfg.Region = c.String("region")
	cfg.Model = c.String("model")
	cfg.Engine = c.String("engine")
	cfg.LoRAs = c.StringSlice("lora")
	cfg.Tokenizer = tokenize.Config{Encoding: c.String("tokenizer"), Dir: c.String("model-dir")}
	if path := c.String("chat-template"); path != "" {
		src, err := os.ReadFile(path)
		if err != nil {
			return cfg, fmt.Errorf("--chat-template: %w", err)
		}
		cfg.Tokenizer.ChatTemplate = string(src)
	}
	// Zero means "the profile's" for these.
	cfg.Hardware = c.String("hardware")
	cfg.CacheBlocks = c.Int("cache-blocks")
	cfg.MaxConcurrency = c.Int("max-concurrency")
	cfg.Timing = enginesim.Timing{
		PrefillOverhead: c.Duration("prefill-overhead"),
		PrefillPerToken: c.Duration("prefill-per-token"),
		DecodeInterval:  c.Duration("decode-interval"),
		LoadFactor:      c.Float64("load-factor"),
	}
	cfg.BlockSize = c.Int("block-size")
	cfg.MaxModelLen = c.Int("max-model-len")
	cfg.DefaultMaxTokens = c.Int("default-max-tokens")
	cfg.TimeScale = c.Float64("time-scale")
	if cfg.TimeScale <= 0 {
		return cfg, fmt.Errorf("--time-scale %v: must be > 0", cfg.TimeScale)
	}
	cfg.HashSeed = c.String("hash-seed")
	cfg.EventBatchSize = c.Int("event-batch-size")
	cfg.EventFlushInterval = c.Duration("event-flush-interval")
	if brokers := c.String("kafka"); brokers != "" {
		cfg.Kafka = &enginesim.KafkaConfig{Brokers: strings.Split(brokers, ","), Topic: c.String("kafka-topic"),
			Security: kafkaSecurity(c, kafkasec.Config{}), Insecure: c.Bool("kafka-insecure")}
	}
	cfg.TLSCert, cfg.TLSKey = c.String("tls-cert"), c.String("tls-key")
	cfg.Faults = enginesim.Faults{
		ErrorRate:      c.Float64("error-rate"),
		StallRate:      c.Float64("stall-rate"),
		StallFor:       enginesim.Duration(c.Duration("stall-for")),
		DieRate:        c.Float64("die-rate"),
		DieAfterChunks: c.Int("die-after-chunks"),
	}
	cfg.Seed = c.Uint64("seed")
	cfg.AdminToken = c.String("admin-token")
	return cfg, nil
}
