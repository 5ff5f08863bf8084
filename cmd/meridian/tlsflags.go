package main

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"

	"github.com/urfave/cli/v2"
)

// tlsClientFlags are the TLS options of every command that talks to a
// controller's API or admin API over https: the CA its certificate chains
// to (meridian certs init writes ca.pem) and, for a listener that asks for
// one, a client certificate (operator.pem).
func tlsClientFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "ca-cert", EnvVars: []string{"MERIDIAN_CA_CERT"}, Usage: "PEM `FILE` of the CA the controllers' certificates chain to"},
		&cli.StringFlag{Name: "client-cert", EnvVars: []string{"MERIDIAN_CLIENT_CERT"}, Usage: "PEM `FILE` of a client certificate (its identity names the operator in audit records)"},
		&cli.StringFlag{Name: "client-key", EnvVars: []string{"MERIDIAN_CLIENT_KEY"}, Usage: "PEM `FILE` of the client certificate's key"},
	}
}

// tlsConfig is the client TLS config the flags ask for (nil: the system's
// roots, no client certificate).
func tlsConfig(c *cli.Context) (*tls.Config, error) {
	ca, cert, key := c.String("ca-cert"), c.String("client-cert"), c.String("client-key")
	if ca == "" && cert == "" && key == "" {
		return nil, nil
	}
	if (cert == "") != (key == "") {
		return nil, usageError("%s: --client-cert and --client-key go together", cmdPath(c))
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		b, err := os.ReadFile(ca)
		if err != nil {
			return nil, usageError("%s: --ca-cert: %w", cmdPath(c), err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(b) {
			return nil, usageError("%s: --ca-cert %s holds no PEM certificate", cmdPath(c), ca)
		}
	}
	if cert != "" {
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, usageError("%s: --client-cert/--client-key: %w", cmdPath(c), err)
		}
		tc.Certificates = []tls.Certificate{kp}
	}
	return tc, nil
}

// tlsHTTPClient is an HTTP client with the flags' TLS config.
func tlsHTTPClient(c *cli.Context) (*http.Client, error) {
	tc, err := tlsConfig(c)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tc, Proxy: http.ProxyFromEnvironment}}, nil
}
