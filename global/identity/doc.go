// Package identity is the machine identity of a controller: the TLS material
// it serves and dials with (certificate, key and the cluster CA, reloaded
// from files so that rotated certificates take effect without a restart),
// the identity a verified peer certificate carries, a development PKI
// (InitDevPKI, behind `meridian certs init`), and the TLS of clients that
// dial servers outside that PKI (ClientTLSConfig: Kafka brokers, https
// pods).
//
// # Identity encoding
//
// A controller certificate names its controller id twice: as the Subject
// CommonName and in a URI SAN
//
//	spiffe://meridian/region/<region>/controller/<id>
//
// which also carries the controller's region. A client-only certificate
// (an operator's CLI, an authenticating gateway) has
//
//	spiffe://meridian/client/<name>
//
// and CommonName <name>. A certificate with no such URI, with more than one,
// or whose CommonName differs from the name in its URI has no identity.
// Region names are 1-63 characters of a-z, 0-9 and '-'; ids and client names
// 1-128 characters of letters, digits, '.', '_' and '-'. Identities are only
// read from verified chains (PeerIdentity, FromRequest, Source.VerifyPeer):
// the CA is the trust root, the URI the name.
//
// # Invariants
//
//   - A handshake always uses the material of the last successful load: a
//     rotated file is picked up by the next handshake after Reload (on
//     demand, or every ReloadInterval); a file that fails to load (bad PEM,
//     a key that does not match the certificate, an expired certificate, a
//     CA file without a CA) leaves the previous material in place, and the
//     failure is returned, counted and logged.
//   - ServerConfig(true) requires and verifies a client certificate against
//     the CA of the current material; RequireControllers narrows a server
//     config to clients with a controller identity (Raft, forwarding);
//     ClientConfig presents the current certificate and verifies the server
//     against the current CA.
//   - ClientTLSConfig.Load verifies servers against its CA (or the system's
//     roots) for the host dialled unless insecure_skip_verify, which its
//     callers accept only from an insecure process; its client certificate
//     is read again at the next handshake after the files change.
//   - No process-global state: metrics go to the Registerer in Deps.
//
// It imports nothing of Meridian's: global, regional and cmd import it.
package identity
