// Package seal seals small values that toolgate hands out and reads back
// later, possibly on another replica: AES-256-GCM under keys derived from
// the operator's secrets with HKDF-SHA256.
//
// A Keyring is made once (at provisioning) from the current secret and any
// previous ones: deriving keys is done then, never per value — a sealed
// value costs one AES-GCM operation to make or open (about a microsecond),
// not a password hash. Each purpose (an MCP session id, …) gets its own
// key from the same secret, so a value sealed for one purpose never opens
// as another. The current secret seals; every secret of the ring opens,
// each value naming its key by a four-byte id, so rotating a secret drops
// nothing: put the new secret first, keep the old one after it for as long
// as values sealed with it live, then remove it.
//
// Nonces are random (96 bits): a key may seal about 2^32 values before the
// chance of a repeated nonce matters, which at a thousand values a second
// is more than a century.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
)

// idSize is the size of the key id a sealed value starts with.
const idSize = 4

// ErrUnsealable reports a value that is not one of the ring's: forged,
// truncated, changed, sealed for another purpose, or sealed with a secret
// the ring no longer holds.
var ErrUnsealable = errors.New("the value cannot be opened with any key of the ring")

// Keyring seals with its first key and opens with any of them. It is safe
// for concurrent use.
type Keyring struct {
	keys []key
}

type key struct {
	id   uint32
	aead cipher.AEAD
}

// New derives the keys of purpose from secrets, the current one first. It
// fails when no secret is given or a secret is empty.
func New(purpose string, secrets ...[]byte) (*Keyring, error) {
	if len(secrets) == 0 {
		return nil, errors.New("seal: no secret")
	}
	r := &Keyring{}
	for _, s := range secrets {
		if len(s) == 0 {
			return nil, errors.New("seal: an empty secret")
		}
		k, err := derive(s, purpose)
		if err != nil {
			return nil, err
		}
		r.keys = append(r.keys, k)
	}
	return r, nil
}

// Random returns a ring with one random key, for values that need not
// outlive this process.
func Random(purpose string) *Keyring {
	s := make([]byte, 32)
	_, _ = rand.Read(s)
	r, _ := New(purpose, s)
	return r
}

// With returns a ring that seals with r's current key and also opens what
// the keys of other open. Either may be nil.
func (r *Keyring) With(other *Keyring) *Keyring {
	switch {
	case r == nil:
		return other
	case other == nil:
		return r
	}
	out := &Keyring{keys: append([]key(nil), r.keys...)}
	for _, k := range other.keys {
		if out.find(k.id) == nil {
			out.keys = append(out.keys, k)
		}
	}
	return out
}

func derive(secret []byte, purpose string) (key, error) {
	material, err := hkdf.Key(sha256.New, secret, []byte("toolgate seal v1"), purpose, 32+idSize)
	if err != nil {
		return key{}, err
	}
	block, err := aes.NewCipher(material[:32])
	if err != nil {
		return key{}, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return key{}, err
	}
	return key{id: binary.BigEndian.Uint32(material[32:]), aead: aead}, nil
}

func (r *Keyring) find(id uint32) *key {
	for i := range r.keys {
		if r.keys[i].id == id {
			return &r.keys[i]
		}
	}
	return nil
}

// Overhead is how many bytes sealing adds to a value.
const Overhead = idSize + 12 + 16

// Seal returns plain sealed with the current key, bound to ad (additional
// data that Open must be given unchanged).
func (r *Keyring) Seal(plain, ad []byte) []byte {
	k := r.keys[0]
	out := make([]byte, idSize+12, Overhead+len(plain))
	binary.BigEndian.PutUint32(out, k.id)
	_, _ = rand.Read(out[idSize:])
	return k.aead.Seal(out, out[idSize:], plain, ad)
}

// Open returns the value sealed, or ErrUnsealable.
func (r *Keyring) Open(sealed, ad []byte) ([]byte, error) {
	if len(sealed) < Overhead {
		return nil, ErrUnsealable
	}
	id := binary.BigEndian.Uint32(sealed)
	for _, k := range r.keys {
		if k.id != id {
			continue
		}
		if plain, err := k.aead.Open(nil, sealed[idSize:idSize+12], sealed[idSize+12:], ad); err == nil {
			return plain, nil
		}
	}
	return nil, ErrUnsealable
}
