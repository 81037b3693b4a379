package gateway

import (
	"context"
	"errors"
	"fmt"
)

// Cipher encrypts credential records before they reach storage and decrypts
// them when they are read back. Implementations are guest modules in the
// toolgate.ciphers namespace (for example toolgate.ciphers.local and
// toolgate.ciphers.vault_transit).
//
// The context names whose record it is (see [CipherContext]). A cipher must
// bind the ciphertext to it: decrypting with another context must fail, so a
// record copied into another user's slot is useless.
//
// Errors from Encrypt and Decrypt must never contain the plaintext. A cipher
// that cannot reach its backend returns an error wrapping [ErrCipherUnavailable],
// which callers report as retryable.
type Cipher interface {
	Encrypt(ctx context.Context, plaintext, context []byte) ([]byte, error)
	Decrypt(ctx context.Context, ciphertext, context []byte) ([]byte, error)
}

// CipherStarter is implemented by ciphers that need to do I/O before their
// first use (create a key file, authenticate to a backend). The toolgate app
// calls Start from its own Start, never from Provision, so `caddy validate`
// has no side effects.
type CipherStarter interface {
	Start(ctx context.Context) error
}

// CipherContext is the context a credential record of user for service is
// encrypted under.
func CipherContext(service, user string) []byte {
	return []byte("toolgate/v1/" + service + "/" + user)
}

// ErrCipherUnavailable reports that a cipher's backend (a Vault server, a key
// file) cannot be used right now. The operation may succeed if retried later.
var ErrCipherUnavailable = errors.New("cipher backend unavailable")

// CipherUnavailable is a cipher module's error for a backend that cannot
// be used right now, in its own words: it wraps ErrCipherUnavailable, which
// callers report as retryable.
func CipherUnavailable(format string, args ...any) error {
	return &cipherUnavailableError{msg: fmt.Sprintf(format, args...)}
}

type cipherUnavailableError struct{ msg string }

func (e *cipherUnavailableError) Error() string { return e.msg }
func (e *cipherUnavailableError) Unwrap() error { return ErrCipherUnavailable }

// ErrCipherRefused reports that a cipher refused to encrypt or decrypt a
// credential for another reason than being unavailable: a revoked token, a
// missing permission or key, a record that does not decrypt. An
// administrator must act; the cipher's error (logged) says what to do.
var ErrCipherRefused = errors.New("the cipher refused the operation")

// ErrCipherMismatch reports that a record does not open with the cipher's
// key and the record's context: it was sealed with another key, or for
// another record, or was changed. Ciphers wrap it, so that a key that
// changed is told apart from a backend that refused the operation (a
// permission, a token), where the key may be the right one.
var ErrCipherMismatch = errors.New("the record does not open with this key")

// cipherError wraps an Encrypt or Decrypt error of a credential record so
// that it tells ErrCipherUnavailable from ErrCipherRefused.
func cipherError(what string, err error) error {
	if errors.Is(err, ErrCipherUnavailable) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrCipherRefused, what, err)
}
