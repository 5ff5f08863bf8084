package main

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/urfave/cli/v2"
)

// kafkaDevCommand is `meridian kafka-dev`: an in-memory Kafka-protocol broker.
func kafkaDevCommand() *cli.Command {
	return &cli.Command{
		Name:  "kafka-dev",
		Usage: "run an in-memory Kafka-protocol broker for development, tests and the demo (NOT for production)",
		Description: "Starts franz-go's kfake: a Kafka-protocol broker that keeps everything in memory, with no\n" +
			"replication, durability, quotas or security. It is for local development, tests and the demo\n" +
			"only; it is not for production. Point controllers and engine simulators at the address it\n" +
			"prints. Topics are created on first use.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "addr", Value: "127.0.0.1:9092", Usage: "listen address of the first broker (further brokers take the next ports)"},
			&cli.IntFlag{Name: "brokers", Value: 1, Usage: "number of brokers"},
			&cli.IntFlag{Name: "partitions", Value: 8, Usage: "partitions of auto-created topics"},
		},
		Action: func(c *cli.Context) error {
			host, port, err := splitHostPort(c.String("addr"))
			if err != nil {
				return usageError("--addr: %w", err)
			}
			n := c.Int("brokers")
			if n < 1 || n > 16 {
				return usageError("--brokers %d: want 1..16", n)
			}
			ports := make([]int, n)
			for i := range ports {
				if port != 0 {
					ports[i] = port + i
				}
			}
			cl, err := kfake.NewCluster(kfake.NumBrokers(n), kfake.Ports(ports...), kfake.AllowAutoTopicCreation(),
				kfake.DefaultNumPartitions(c.Int("partitions")),
				kfake.ListenFn(listenOn(host)))
			if err != nil {
				return fmt.Errorf("kafka-dev: %w", err)
			}
			defer cl.Close()
			for _, a := range cl.ListenAddrs() {
				fmt.Fprintln(c.App.Writer, a)
			}
			fmt.Fprintln(c.App.ErrWriter, "kafka-dev: in-memory broker running (not for production); Ctrl-C to stop")
			<-c.Context.Done()
			return nil
		},
	}
}
