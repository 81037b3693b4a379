package gateway

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"time"
)

// now is the clock; tests replace it.
var now = time.Now

// NewID returns a random identifier of 192 bits, URL-safe. Session ids,
// decision ids and OAuth states use it; crypto/rand never fails on the
// platforms Go supports.
func NewID() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// hashKey returns the hex SHA-256 of s: how secrets and user names appear in
// storage keys, so a storage listing reveals neither.
func hashKey(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// isHashKey reports whether s has the shape of a hashKey: 64 lower-case
// hex digits. Storage keys built from input that names a record by its
// hash take nothing else.
func isHashKey(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
