package kms

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/toolgate/toolgate/modules/gateway"
)

// The stored form of a value, all on one line of ASCII:
//
//	kms:v1:<key id>.<wrapped data key>.<nonce and ciphertext>
//
// "kms:v1:" is the version tag; each of the three parts is unpadded
// base64url. The key id is the ARN of the KMS key that wrapped the data key
// (as KMS reported it, so an alias resolves to the key behind it at the
// time of writing); the wrapped data key is KMS's ciphertext blob of the
// 256-bit data key, bound by KMS to the record's encryption context; the
// last part is a 12-byte random nonce followed by the AES-256-GCM sealing of
// the value. The GCM additional data is everything before the last part
// followed by the record's context, so neither the key id, nor the wrapped
// key, nor the record's owner can be changed without the value failing to
// open.
const (
	prefix = "kms:v1:"

	dataKeySize = 32 // AES-256

	// Bounds on the parts of a stored value, well above what KMS returns
	// (key ARNs are at most 2,048 characters, ciphertext blobs at most
	// 6,144 bytes), so a damaged record is refused before any KMS call.
	maxKeyIDLen   = 2048
	maxWrappedLen = 6144
)

// envelope is a parsed stored value.
type envelope struct {
	keyID   string
	wrapped []byte // KMS's ciphertext blob of the data key
	sealed  []byte // nonce followed by the GCM ciphertext
	header  string // the stored form up to and including the last '.'
}

var errNotEnvelope = errors.New("kms cipher: not a kms:v1 ciphertext")

// parseEnvelope splits a stored value into its parts. It checks the shape
// only; whether it opens is up to KMS and GCM.
func parseEnvelope(stored []byte) (*envelope, error) {
	s := string(stored)
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok {
		return nil, errNotEnvelope
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return nil, errors.New("kms cipher: malformed kms:v1 ciphertext (want three parts)")
	}
	for _, p := range parts {
		if !isBase64URL(p) {
			return nil, errors.New("kms cipher: malformed kms:v1 ciphertext (not base64url)")
		}
	}
	keyID, err1 := b64.DecodeString(parts[0])
	wrapped, err2 := b64.DecodeString(parts[1])
	sealed, err3 := b64.DecodeString(parts[2])
	switch {
	case err1 != nil || err2 != nil || err3 != nil:
		return nil, errors.New("kms cipher: malformed kms:v1 ciphertext (not base64url)")
	case len(keyID) == 0 || len(keyID) > maxKeyIDLen:
		return nil, errors.New("kms cipher: malformed kms:v1 ciphertext (key id)")
	case len(wrapped) == 0 || len(wrapped) > maxWrappedLen:
		return nil, errors.New("kms cipher: malformed kms:v1 ciphertext (wrapped data key)")
	case len(sealed) < gcmNonceSize+gcmTagSize:
		return nil, errors.New("kms cipher: malformed kms:v1 ciphertext (too short)")
	}
	return &envelope{
		keyID:   string(keyID),
		wrapped: wrapped,
		sealed:  sealed,
		header:  s[:len(s)-len(parts[2])],
	}, nil
}

// isBase64URL reports whether s uses only the unpadded base64url alphabet
// (the decoder alone would also skip line breaks).
func isBase64URL(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

const (
	gcmNonceSize = 12
	gcmTagSize   = 16
)

var b64 = base64.RawURLEncoding

// envelopeHeader is the stored form's prefix for a data key wrapped by
// keyID.
func envelopeHeader(keyID string, wrapped []byte) string {
	return prefix + b64.EncodeToString([]byte(keyID)) + "." + b64.EncodeToString(wrapped) + "."
}

// additionalData binds a value to its header and its record.
func additionalData(header string, record []byte) []byte {
	ad := make([]byte, 0, len(header)+len(record))
	ad = append(ad, header...)
	return append(ad, record...)
}

// newAEAD makes AES-256-GCM from a data key and then clears the key bytes,
// so the only copy left is inside the cipher.
func newAEAD(key []byte) (cipher.AEAD, error) {
	defer clear(key)
	if len(key) != dataKeySize {
		return nil, errors.New("kms cipher: KMS returned a data key of the wrong size")
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// seal encrypts plaintext under aead for the given header and record (its
// cipher context) and returns the complete stored form.
func seal(aead cipher.AEAD, header string, plaintext, record []byte) ([]byte, error) {
	nonce := make([]byte, gcmNonceSize, gcmNonceSize+len(plaintext)+gcmTagSize)
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	sealed := aead.Seal(nonce, nonce, plaintext, additionalData(header, record))
	out := make([]byte, len(header)+b64.EncodedLen(len(sealed)))
	copy(out, header)
	b64.Encode(out[len(header):], sealed)
	return out, nil
}

// errWrongContext is the error for a value that does not open: it belongs to
// another record, or was changed.
var errWrongContext = fmt.Errorf("kms cipher: %w: it was encrypted for another (service, user) or was changed", gateway.ErrCipherMismatch)

// open decrypts an envelope's value with its unwrapped data key.
func (e *envelope) open(aead cipher.AEAD, record []byte) ([]byte, error) {
	nonce, ct := e.sealed[:gcmNonceSize], e.sealed[gcmNonceSize:]
	plain, err := aead.Open(nil, nonce, ct, additionalData(e.header, record))
	if err != nil {
		return nil, errWrongContext
	}
	return plain, nil
}
