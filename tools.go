//go:build tools

// This file pins the module versions the packages of this repository use (see
// ../shared/reference/go-deps.md: other combinations of raft, memberlist, serf,
// raft-wal and franz-go do not compile together). It is never built; `go mod
// tidy` keeps the requirements because of these imports.
package meridian

import (
	_ "cel.dev/cel-go/cel"
	_ "github.com/Shopify/toxiproxy/v2"
	_ "github.com/anishathalye/porcupine"
	_ "github.com/cespare/xxhash/v2"
	_ "github.com/go-zeromq/zmq4"
	_ "github.com/hashicorp/memberlist"
	_ "github.com/hashicorp/raft"
	_ "github.com/hashicorp/raft-wal"
	_ "github.com/hashicorp/serf/coordinate"
	_ "github.com/nikolalohinski/gonja/v2"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/segmentio/kafka-go"
	_ "github.com/tiktoken-go/tokenizer"
	_ "github.com/twmb/franz-go/pkg/kfake"
	_ "github.com/urfave/cli/v2"
	_ "github.com/vmihailenco/msgpack/v5"
	_ "go.uber.org/goleak"
	_ "go.yaml.in/yaml/v3"
	_ "pgregory.net/rapid"
)
