package main

import (
	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/global/identity"
	"github.com/meridian-llm/meridian/regional/kafkasec"
)

// kafkaSecurityFlags are the TLS and SASL options of every command that
// talks to Kafka from the command line (engine-sim, kv-bridge, events
// tail): the flag form of a controller's kafka.tls and kafka.sasl. The
// password is never a flag: it is read from --kafka-sasl-password-file or
// $MERIDIAN_KAFKA_PASSWORD.
func kafkaSecurityFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "kafka-ca", Usage: "PEM `FILE` of the CA the brokers' certificates chain to; turns TLS on (kafka.tls.ca)"},
		&cli.StringFlag{Name: "kafka-cert", Usage: "PEM `FILE` of a client certificate for brokers that require one; turns TLS on (kafka.tls.cert)"},
		&cli.StringFlag{Name: "kafka-key", Usage: "PEM `FILE` of the client certificate's key (kafka.tls.key)"},
		&cli.StringFlag{Name: "kafka-server-name", Usage: "name the brokers' certificates must be valid for (default: each broker's host); turns TLS on"},
		&cli.BoolFlag{Name: "kafka-tls", Usage: "TLS to the brokers with the system's roots (implied by --kafka-ca, --kafka-cert, --kafka-server-name)"},
		&cli.StringFlag{Name: "kafka-sasl-mechanism", Usage: "SASL mechanism: scram-sha-256, scram-sha-512 or plain (kafka.sasl.mechanism)"},
		&cli.StringFlag{Name: "kafka-sasl-user", Usage: "SASL user name (kafka.sasl.username)"},
		&cli.StringFlag{Name: "kafka-sasl-password-file", Usage: "`FILE` holding the SASL password (default: $" + kafkasec.DefaultPasswordEnv + ")"},
		&cli.BoolFlag{Name: "kafka-insecure", Usage: "accept plaintext to brokers beyond loopback (development only; logged)"},
	}
}

// kafkaSecurity applies the flags over base (a configuration file's kafka
// section): a TLS flag sets that field of kafka.tls, a SASL flag of
// kafka.sasl.
func kafkaSecurity(c *cli.Context, base kafkasec.Config) kafkasec.Config {
	out := base
	if c.Bool("kafka-tls") || c.String("kafka-ca") != "" || c.String("kafka-cert") != "" || c.String("kafka-key") != "" || c.String("kafka-server-name") != "" {
		t := identity.ClientTLSConfig{}
		if base.TLS != nil {
			t = *base.TLS
		}
		for flag, dst := range map[string]*string{"kafka-ca": &t.CA, "kafka-cert": &t.Cert, "kafka-key": &t.Key, "kafka-server-name": &t.ServerName} {
			if v := c.String(flag); v != "" {
				*dst = v
			}
		}
		out.TLS = &t
	}
	if c.String("kafka-sasl-mechanism") != "" || c.String("kafka-sasl-user") != "" || c.String("kafka-sasl-password-file") != "" {
		s := kafkasec.SASLConfig{}
		if base.SASL != nil {
			s = *base.SASL
		}
		for flag, dst := range map[string]*string{"kafka-sasl-mechanism": &s.Mechanism, "kafka-sasl-user": &s.Username, "kafka-sasl-password-file": &s.PasswordFile} {
			if v := c.String(flag); v != "" {
				*dst = v
			}
		}
		if c.String("kafka-sasl-password-file") != "" {
			s.PasswordEnv = ""
		}
		out.SASL = &s
	}
	return out
}
