package auth

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
)

// GenerateKey makes a new API key: 32 random bytes, base64url without
// padding (43 characters). digest is its hex SHA-256, the sha256 field of
// its keys-file entry; only the digest goes in the file, the key goes to
// the client.
func GenerateKey() (key, digest string, err error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", fmt.Errorf("generate key: %w", err)
	}
	key = base64.RawURLEncoding.EncodeToString(b)
	return key, KeyDigest(key), nil
}
