// Package kafkasec is how Meridian's Kafka clients secure their connections
// to the brokers: the kafka.tls and kafka.sasl sections that the
// controller's ingest consumer, the kv-bridge producer, the engine
// simulator's producer and the CLI's readers share, their validation, and
// the kafka-go Dialer (readers) and Transport (writers, admin and metadata
// clients) built from them.
//
// # Invariants
//
//   - Secure by default: Validate refuses a broker beyond loopback without
//     TLS, insecure_skip_verify, and SASL PLAIN without TLS, unless the
//     caller runs insecure (its own explicit, logged opt-out); InsecureUses
//     lists what that opt-out then accepts, for the caller's loud log.
//   - The SASL password comes from a file or an environment variable named
//     in the configuration, never from the configuration itself, and is read
//     only by Open. It appears in no error, log line, metric or printed
//     configuration: Client prints as its mechanism and user only.
//   - Errors of a refused authentication or an untrusted broker certificate
//     are explained (Explain) with the section and field to check.
//
// It imports global/identity (ClientTLSConfig) and kafka-go, nothing else of
// ours. Test brokers with TLS and SCRAM (kfake) are in kafkasectest.
package kafkasec
