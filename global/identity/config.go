package identity

import (
	"crypto/tls"
	"errors"
	"fmt"
	"path/filepath"
	"time"
)

// TLSConfig names the TLS material of a listener or client, as it appears
// in a controller's YAML configuration.
type TLSConfig struct {
	// Cert is the PEM file of this controller's certificate (leaf first,
	// then any intermediates). Required.
	Cert string `yaml:"cert" json:"cert"`
	// Key is the PEM file of the certificate's private key (PKCS#8, EC or
	// PKCS#1). Required; keep it mode 0600.
	Key string `yaml:"key" json:"key"`
	// ClientCA is the PEM file of the CA certificates that peers' certificates
	// must chain to: clients of a mutual listener, and servers this
	// controller dials. Required.
	ClientCA string `yaml:"client_ca" json:"client_ca"`
	// MinVersion is the lowest TLS version accepted: "1.2" or "1.3".
	// Default "1.3" (also when empty).
	MinVersion string `yaml:"min_version" json:"min_version"`
	// ReloadInterval is how often the three files are read again to pick up
	// a rotation (Reload also does it on demand). Default 1m (also when
	// zero); at least 1s.
	ReloadInterval time.Duration `yaml:"reload_interval" json:"reload_interval"`
}

// Defaults of TLSConfig.
const (
	DefaultMinVersion     = "1.3"
	DefaultReloadInterval = time.Minute
	minReloadInterval     = time.Second
)

// DefaultTLSConfig returns a TLSConfig with the optional fields at their
// defaults; Cert, Key and ClientCA must still be set.
func DefaultTLSConfig() TLSConfig {
	return TLSConfig{MinVersion: DefaultMinVersion, ReloadInterval: DefaultReloadInterval}
}

// Validate checks the fields without touching the files (Open reads them);
// errors name the field and the bad value.
func (c TLSConfig) Validate() error {
	var errs []error
	if c.Cert == "" {
		errs = append(errs, errors.New("tls.cert: must be set (PEM certificate file)"))
	}
	if c.Key == "" {
		errs = append(errs, errors.New("tls.key: must be set (PEM private key file)"))
	}
	if c.ClientCA == "" {
		errs = append(errs, errors.New("tls.client_ca: must be set (PEM file of the CA peers chain to)"))
	}
	if _, err := parseMinVersion(c.MinVersion); err != nil {
		errs = append(errs, err)
	}
	if c.ReloadInterval < 0 || (c.ReloadInterval > 0 && c.ReloadInterval < minReloadInterval) {
		errs = append(errs, fmt.Errorf("tls.reload_interval = %v: want at least %v (0: the default %v)", c.ReloadInterval, minReloadInterval, DefaultReloadInterval))
	}
	return errors.Join(errs...)
}

func parseMinVersion(v string) (uint16, error) {
	switch v {
	case "", "1.3":
		return tls.VersionTLS13, nil
	case "1.2":
		return tls.VersionTLS12, nil
	}
	return 0, fmt.Errorf("tls.min_version = %q: want \"1.2\" or \"1.3\"", v)
}

func (c TLSConfig) reloadInterval() time.Duration {
	if c.ReloadInterval == 0 {
		return DefaultReloadInterval
	}
	return c.ReloadInterval
}

// ResolvePaths makes the relative file names of c relative to dir (the
// directory of the configuration file that named them).
func (c *TLSConfig) ResolvePaths(dir string) {
	for _, p := range []*string{&c.Cert, &c.Key, &c.ClientCA} {
		*p = resolvePath(dir, *p)
	}
}

// ResolvePaths makes the relative file names of c relative to dir (the
// directory of the configuration file that named them).
func (c *ClientTLSConfig) ResolvePaths(dir string) {
	for _, p := range []*string{&c.CA, &c.Cert, &c.Key} {
		*p = resolvePath(dir, *p)
	}
}

// resolvePath joins a relative name to dir; empty and absolute names are
// kept as they are.
func resolvePath(dir, name string) string {
	if name == "" || filepath.IsAbs(name) {
		return name
	}
	return filepath.Join(dir, name)
}
