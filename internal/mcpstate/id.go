package mcpstate

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"time"

	"github.com/toolgate/toolgate/internal/seal"
)

// ID is what a runner's Mcp-Session-Id carries, sealed: everything a
// replica checks before it looks at storage. A replica opens it with the
// key derived from the configured secret (see internal/seal), so an id that
// is forged, altered, expired, or sealed under a secret no replica holds
// any longer costs no storage read: it is simply unknown (404).
type ID struct {
	// Ref names the session in storage: 128 random bits, hex.
	Ref string
	// Expires is when the id stops working: the toolgate session's
	// expiry, which an MCP session never outlives (for a session toolgate
	// implied, the longest a session lives from the initialize).
	Expires time.Time
	// Owner binds the id to the caller and their toolgate session (see
	// [Owner]); it holds neither.
	Owner [16]byte
	// Service is the service the session was initialized with.
	Service string
	// Session is the id of the toolgate session the MCP session was
	// initialized in: for a runner that sends no session header, the
	// session toolgate implied for it.
	Session string
}

// Purpose is the seal purpose of MCP session ids.
const Purpose = "toolgate mcp-session-id v1"

// ad binds a sealed id to its use.
var ad = []byte("Mcp-Session-Id")

// maxIDText bounds the Mcp-Session-Id a replica tries to open.
const maxIDText = 512

// ErrBadID reports an Mcp-Session-Id that is not one of toolgate's (or no
// longer opens).
var ErrBadID = errors.New("not an MCP session id of this gateway")

// NewRef returns a fresh random session ref.
func NewRef() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Owner is the binding of an id to user and their toolgate session id: a
// SHA-256 prefix, so the sealed id reveals neither even to someone who
// could open it.
func Owner(user, toolgateSession string) [16]byte {
	h := sha256.Sum256([]byte("toolgate mcp-session owner\x00" + user + "\x00" + toolgateSession))
	var o [16]byte
	copy(o[:], h[:16])
	return o
}

// Owns reports whether the id belongs to user in toolgateSession.
func (id ID) Owns(user, toolgateSession string) bool {
	o := Owner(user, toolgateSession)
	return subtle.ConstantTimeCompare(o[:], id.Owner[:]) == 1
}

// Seal returns id as an Mcp-Session-Id: base64url, visible ASCII as the
// transport requires.
func Seal(r *seal.Keyring, id ID) string {
	ref, _ := hex.DecodeString(id.Ref)
	plain := make([]byte, 0, 16+8+16+2*binary.MaxVarintLen64+len(id.Service)+len(id.Session))
	plain = append(plain, ref...)
	plain = binary.BigEndian.AppendUint64(plain, uint64(id.Expires.Unix()))
	plain = append(plain, id.Owner[:]...)
	plain = binary.AppendUvarint(plain, uint64(len(id.Service)))
	plain = append(plain, id.Service...)
	plain = append(plain, id.Session...)
	return base64.RawURLEncoding.EncodeToString(r.Seal(plain, ad))
}

// Open returns the id an Mcp-Session-Id carries, or ErrBadID. It does not
// check the expiry (see [ID.Expired]).
func Open(r *seal.Keyring, text string) (ID, error) {
	if len(text) > maxIDText {
		return ID{}, ErrBadID
	}
	sealed, err := base64.RawURLEncoding.DecodeString(text)
	if err != nil {
		return ID{}, ErrBadID
	}
	plain, err := r.Open(sealed, ad)
	if err != nil || len(plain) < 40 {
		return ID{}, ErrBadID
	}
	n, size := binary.Uvarint(plain[40:])
	if size <= 0 || n > uint64(len(plain)-40-size) {
		return ID{}, ErrBadID
	}
	rest := plain[40+size:]
	id := ID{Ref: hex.EncodeToString(plain[:16]), Expires: time.Unix(int64(binary.BigEndian.Uint64(plain[16:24])), 0),
		Service: string(rest[:n]), Session: string(rest[n:])}
	copy(id.Owner[:], plain[24:40])
	return id, nil
}

// Expired reports whether the id no longer works at t.
func (id ID) Expired(t time.Time) bool { return !t.Before(id.Expires) }
