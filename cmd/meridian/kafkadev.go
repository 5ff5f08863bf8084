package main

import (
	"crypto/tls"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/regional/kafkasec"
)

// kafkaDevCommand is `meridian kafka-dev`: an in-memory Kafka-protocol broker.
func kafkaDevCommand() *cli.Command {
	return &cli.Command{
		Name:  "kafka-dev",
		Usage: "run an in-memory Kafka-protocol broker for development, tests and the demo (NOT for production)",
		Description: "Starts franz-go's kfake: a Kafka-protocol broker that keeps everything in memory, with no\n" +
			"replication, durability, quotas or security. It is for local development, tests and the demo\n" +
			"only; it is not for production. Point controllers and engine simulators at the address it\n" +
			"prints. Topics are created on first use.\n\n" +
			"To try the secure path: --tls-cert/--tls-key (e.g. a certificate of `meridian certs init`)\n" +
			"make it speak TLS only, and --sasl-user with the password in --sasl-password-file (or\n" +
			"$" + kafkasec.DefaultPasswordEnv + ") accepts that one SCRAM user only; clients then set kafka.tls.ca and\n" +
			"kafka.sasl (or --kafka-ca and --kafka-sasl-*).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "addr", Value: "127.0.0.1:9092", Usage: "listen address of the first broker (further brokers take the next ports)"},
			&cli.IntFlag{Name: "brokers", Value: 1, Usage: "number of brokers"},
			&cli.IntFlag{Name: "partitions", Value: 8, Usage: "partitions of auto-created topics"},
			&cli.StringFlag{Name: "tls-cert", Usage: "PEM `FILE` of the brokers' certificate: TLS only"},
			&cli.StringFlag{Name: "tls-key", Usage: "PEM `FILE` of its key"},
			&cli.StringFlag{Name: "sasl-user", Usage: "require SASL: this user only"},
			&cli.StringFlag{Name: "sasl-mechanism", Value: kafkasec.ScramSHA256, Usage: "the user's mechanism: scram-sha-256, scram-sha-512 or plain"},
			&cli.StringFlag{Name: "sasl-password-file", Usage: "`FILE` holding the user's password (default: $" + kafkasec.DefaultPasswordEnv + ")"},
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
			opts := []kfake.Opt{kfake.NumBrokers(n), kfake.Ports(ports...), kfake.AllowAutoTopicCreation(),
				kfake.DefaultNumPartitions(c.Int("partitions")), kfake.ListenFn(listenOn(host))}
			sec, err := kafkaDevSecurity(c)
			if err != nil {
				return err
			}
			cl, err := kfake.NewCluster(append(opts, sec...)...)
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

// kafkaDevSecurity is the brokers' TLS and SASL the flags ask for.
func kafkaDevSecurity(c *cli.Context) ([]kfake.Opt, error) {
	var opts []kfake.Opt
	cert, key := c.String("tls-cert"), c.String("tls-key")
	if (cert == "") != (key == "") {
		return nil, usageError("kafka-dev: --tls-cert and --tls-key go together")
	}
	if cert != "" {
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, usageError("kafka-dev: --tls-cert/--tls-key: %w", err)
		}
		opts = append(opts, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{kp}, MinVersion: tls.VersionTLS12}))
	}
	if user := c.String("sasl-user"); user != "" {
		s := kafkasec.SASLConfig{Mechanism: c.String("sasl-mechanism"), Username: user, PasswordFile: c.String("sasl-password-file")}
		sec := kafkasec.Config{SASL: &s}
		if err := sec.Validate("kafka-dev", nil, true); err != nil {
			return nil, usageError("kafka-dev: %w", err)
		}
		pass, err := s.Password("kafka-dev", nil)
		if err != nil {
			return nil, usageError("kafka-dev: %w", err)
		}
		opts = append(opts, kfake.EnableSASL(), kfake.Superuser(strings.ToUpper(s.Mechanism), user, pass))
	}
	return opts, nil
}
