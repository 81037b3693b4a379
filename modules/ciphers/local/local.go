// Package local is the toolgate.ciphers.local cipher: AES-256-GCM with a key
// kept in a file. It is the embedded default; use vault_transit in
// production so the key never sits on the gateway's disk.
package local

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	caddy.RegisterModule(Cipher{})
}

// Cipher encrypts with AES-256-GCM. The record's context (service and user)
// is the additional authenticated data, so a record moved to another user's
// slot fails to decrypt.
//
//	cipher local {
//		key_file <path>
//	}
type Cipher struct {
	// KeyFile holds the 32-byte key, base64-encoded. It is created (mode
	// 0600) when the gateway starts if it does not exist. Default:
	// toolgate/local-cipher.key in Caddy's data directory. Losing it makes
	// every stored credential unreadable; users then connect again.
	KeyFile string `json:"key_file,omitempty"`

	key    *loadedKey
	logger *zap.Logger
}

// loadedKey is the key once read; Start may fill it after Provision.
type loadedKey struct {
	mu   sync.RWMutex
	aead cipher.AEAD
	made bool // Start made the key file: a record sealed before was sealed with another key
}

// CaddyModule returns the Caddy module information.
func (Cipher) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "toolgate.ciphers.local",
		New: func() caddy.Module { return new(Cipher) },
	}
}

// prefix marks this cipher's output and its format version.
var prefix = []byte("local:v1:")

// Provision loads the key if the file exists; Start creates a missing one,
// so that `caddy validate` writes nothing.
func (c *Cipher) Provision(ctx caddy.Context) error {
	c.logger = ctx.Logger()
	c.key = new(loadedKey)
	if c.KeyFile == "" {
		c.KeyFile = filepath.Join(caddy.AppDataDir(), "toolgate", "local-cipher.key")
	}
	c.KeyFile = caddy.NewReplacer().ReplaceKnown(c.KeyFile, "")
	err := c.load()
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// Start creates the key file when it does not exist yet.
func (c *Cipher) Start(context.Context) error {
	c.key.mu.RLock()
	ready := c.key.aead != nil
	c.key.mu.RUnlock()
	if ready {
		return nil
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(c.KeyFile), 0o700); err != nil {
		return fmt.Errorf("creating the key file's directory: %v", err)
	}
	// Written whole to a file of its own first, then linked into place,
	// which fails if the key file exists: a replica starting at the same
	// moment never reads a key file half written, and a crash leaves no
	// empty one.
	f, err := os.CreateTemp(filepath.Dir(c.KeyFile), ".toolgate-key-*")
	if err != nil {
		return fmt.Errorf("creating key file: %v", err)
	}
	defer os.Remove(f.Name())
	_, err = f.WriteString(base64.StdEncoding.EncodeToString(key) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing key file %s: %v", c.KeyFile, err)
	}
	if err := os.Link(f.Name(), c.KeyFile); errors.Is(err, fs.ErrExist) {
		return c.load() // another process created it first
	} else if err != nil {
		return fmt.Errorf("creating key file %s: %v", c.KeyFile, err)
	}
	c.logger.Info("created a new local cipher key; back it up, or stored credentials are lost with it", zap.String("key_file", c.KeyFile))
	if err := c.load(); err != nil {
		return err
	}
	c.key.mu.Lock()
	c.key.made = true
	c.key.mu.Unlock()
	return nil
}

func (c *Cipher) load() error {
	data, err := os.ReadFile(c.KeyFile)
	if err != nil {
		return err
	}
	// Whoever reads the key decrypts every stored credential: a key file
	// any user of the host may read is refused (as ssh refuses such a
	// private key), one its group may read is used with a warning.
	if info, err := os.Stat(c.KeyFile); err == nil {
		switch mode := info.Mode().Perm(); {
		case mode&0o007 != 0:
			return fmt.Errorf("key file %s has mode %v: every user of the host may read it, and with it every stored credential; chmod 600 it (for a Kubernetes secret, defaultMode 0400)", c.KeyFile, mode)
		case mode&0o070 != 0:
			c.logger.Warn("the local cipher's key file can be read by its group; whoever reads it decrypts every stored credential",
				zap.String("key_file", c.KeyFile), zap.Stringer("mode", mode))
		}
	}
	key, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(data)))
	if err != nil || len(key) != 32 {
		return fmt.Errorf("key file %s must hold 32 bytes, base64-encoded", c.KeyFile)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return err
	}
	c.key.mu.Lock()
	c.key.aead = aead
	c.key.mu.Unlock()
	return nil
}

func (c *Cipher) current() (cipher.AEAD, error) {
	c.key.mu.RLock()
	defer c.key.mu.RUnlock()
	if c.key.aead == nil {
		return nil, fmt.Errorf("%w: the local cipher key %s is not loaded", gateway.ErrCipherUnavailable, c.KeyFile)
	}
	return c.key.aead, nil
}

// Encrypt seals plaintext, bound to context.
func (c *Cipher) Encrypt(_ context.Context, plaintext, context []byte) ([]byte, error) {
	aead, err := c.current()
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plaintext)+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	sealed := aead.Seal(nonce, nonce, plaintext, context)
	out := make([]byte, len(prefix)+base64.StdEncoding.EncodedLen(len(sealed)))
	copy(out, prefix)
	base64.StdEncoding.Encode(out[len(prefix):], sealed)
	return out, nil
}

// Decrypt opens ciphertext sealed for context.
func (c *Cipher) Decrypt(_ context.Context, ciphertext, context []byte) ([]byte, error) {
	aead, err := c.current()
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(ciphertext, prefix) {
		return nil, errors.New("local cipher: not a local:v1 ciphertext")
	}
	sealed, err := base64.StdEncoding.DecodeString(string(ciphertext[len(prefix):]))
	if err != nil || len(sealed) < aead.NonceSize() {
		return nil, errors.New("local cipher: malformed ciphertext")
	}
	plain, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], context)
	if err != nil {
		c.key.mu.RLock()
		made := c.key.made
		c.key.mu.RUnlock()
		if made {
			// Said so, an operator does not take the key file for the one
			// that was lost.
			return nil, fmt.Errorf("local cipher: %w and context (the key file %s was made new when this gateway started, as none was there: the key the record was sealed with is not in it)",
				gateway.ErrCipherMismatch, c.KeyFile)
		}
		return nil, fmt.Errorf("local cipher: %w and context", gateway.ErrCipherMismatch)
	}
	return plain, nil
}

// UnmarshalCaddyfile reads:
//
//	cipher local [<key_file>] {
//		key_file <path>
//	}
func (c *Cipher) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // module name
	if d.NextArg() {
		c.KeyFile = d.Val()
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "key_file":
			if c.KeyFile != "" {
				return d.Errf("cipher local: key_file given twice")
			}
			if !d.NextArg() {
				return d.ArgErr()
			}
			c.KeyFile = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		default:
			return d.Errf("cipher local: unknown option %q", d.Val())
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner     = (*Cipher)(nil)
	_ caddyfile.Unmarshaler = (*Cipher)(nil)
	_ gateway.Cipher        = (*Cipher)(nil)
	_ gateway.CipherStarter = (*Cipher)(nil)
)
