package mcp2026

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// State is what toolgate seals into the requestState of its own
// input_required answers (an approval asked for): what the retry must match
// and until when. It travels through the runner, which can read nothing of
// it and change nothing without the seal failing.
type State struct {
	Caller   string `json:"c"`
	Session  string `json:"s"` // the toolgate session's reference, not its id
	Service  string `json:"v"`
	Method   string `json:"m"`
	Tool     string `json:"t,omitempty"`
	URI      string `json:"u,omitempty"` // what a resources/* call names
	Args     string `json:"a"`           // hex SHA-256 of the arguments as they would go upstream (other methods: CallParams)
	Approval string `json:"p,omitempty"`
	Held     string `json:"h,omitempty"` // the upstream exchange toolgate holds for the retry (Hold)
	// Inputs are the methods of the held exchange's input requests, by
	// key: what each of the retry's input responses answers.
	Inputs map[string]string `json:"i,omitempty"`
	// Relayed is set for a state toolgate sealed in place of an
	// upstream's (see Relay); Upstream is the JSON text of the upstream's
	// requestState, "" when it sent none.
	Relayed  bool   `json:"x,omitempty"`
	Upstream string `json:"r,omitempty"`
	Expires  int64  `json:"e"` // unix seconds
	Nonce    string `json:"n"`
}

// statePrefix marks a requestState sealed by toolgate; any other
// requestState is the upstream's and passes byte for byte.
const statePrefix = "toolgate.1."

// IsOwnState reports whether a requestState (its decoded string) claims to
// be toolgate's. A claim is verified by Open; one that fails is refused,
// never passed upstream.
func IsOwnState(s string) bool { return strings.HasPrefix(s, statePrefix) }

// Errors of Open and Consume.
var (
	ErrStateInvalid  = errors.New("the requestState was not issued by this gateway or was changed")
	ErrStateExpired  = errors.New("the requestState has expired")
	ErrStateMismatch = errors.New("the requestState belongs to another call")
	ErrStateReplayed = errors.New("the requestState was already used")
)

// sealer seals and opens States with AES-256-GCM: it seals with the key
// of the first secret and opens with the key of any (state_secret and the
// ones it replaced).
type sealer struct{ aeads []cipher.AEAD }

func newSealer(secrets ...[]byte) (*sealer, error) {
	s := &sealer{}
	for _, secret := range secrets {
		key, err := hkdf.Key(sha256.New, secret, nil, "toolgate mcp requestState v1", 32)
		if err != nil {
			return nil, err
		}
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		s.aeads = append(s.aeads, aead)
	}
	if len(s.aeads) == 0 {
		return nil, errors.New("no secret to seal requestStates with")
	}
	return s, nil
}

var stateAD = []byte("toolgate requestState")

// Seal returns st sealed, with a fresh nonce.
func (s *sealer) Seal(st State) (string, error) {
	n := make([]byte, 16)
	if _, err := rand.Read(n); err != nil {
		return "", err
	}
	st.Nonce = hex.EncodeToString(n)
	plain, err := json.Marshal(st)
	if err != nil {
		return "", err
	}
	aead := s.aeads[0]
	iv := make([]byte, aead.NonceSize())
	if _, err := rand.Read(iv); err != nil {
		return "", err
	}
	sealed := aead.Seal(iv, iv, plain, stateAD)
	return statePrefix + base64.RawURLEncoding.EncodeToString(sealed), nil
}

// Open verifies a sealed state and returns it, checking its expiry
// against now.
func (s *sealer) Open(text string, now time.Time) (State, error) {
	var st State
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(text, statePrefix))
	if !IsOwnState(text) || err != nil || len(raw) < s.aeads[0].NonceSize()+s.aeads[0].Overhead() {
		return st, ErrStateInvalid
	}
	ns := s.aeads[0].NonceSize()
	var plain []byte
	for _, aead := range s.aeads {
		if plain, err = aead.Open(nil, raw[:ns], raw[ns:], stateAD); err == nil {
			break
		}
	}
	if err != nil || json.Unmarshal(plain, &st) != nil || st.Nonce == "" {
		return State{}, ErrStateInvalid
	}
	if now.Unix() >= st.Expires {
		return st, ErrStateExpired
	}
	return st, nil
}

// StateOf is the state of the call by caller in the toolgate session
// sessionRef to service that msg makes: what a requestState is bound to.
func StateOf(caller, sessionRef, service string, msg mcpmsg.Message) State {
	args := msg.Arguments
	if msg.Method != "tools/call" {
		args = CallParams(msg.Params) // a subscriptions/listen's filter, a prompt's arguments, …
	}
	return State{Caller: caller, Session: sessionRef, Service: service, Method: msg.Method,
		Tool: msg.Name, URI: msg.URI, Args: ArgsDigest(args)}
}

// Matches checks that st was issued for the call want describes (every
// field but Approval, Held, Expires and Nonce).
func (st State) Matches(want State) error {
	if st.Caller != want.Caller || st.Session != want.Session || st.Service != want.Service ||
		st.Method != want.Method || st.Tool != want.Tool || st.URI != want.URI || st.Args != want.Args {
		return ErrStateMismatch
	}
	return nil
}

// usedPrefix is where storage records the requestStates that were used,
// until they expire.
const usedPrefix = "toolgate/mcp-request-states"

// consume records st's nonce as used, once across every replica sharing
// storage: a second use fails with ErrStateReplayed. The record keeps the
// state's expiry, after which sweepUsed deletes it (the state is refused
// as expired by then).
func consume(ctx context.Context, storage certmagic.Storage, st State) error {
	name := usedPrefix + "/" + st.Nonce
	if err := storage.Lock(ctx, name); err != nil {
		return err
	}
	defer func() { _ = storage.Unlock(context.WithoutCancel(ctx), name) }()
	// Stat, not Exists: Exists answers false when the storage fails, and
	// a state would then be used twice.
	switch _, err := storage.Stat(ctx, name); {
	case err == nil:
		return ErrStateReplayed
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	exp, _ := json.Marshal(st.Expires)
	return storage.Store(ctx, name, exp)
}

// sweepUsed deletes the records of used requestStates that expired at
// now, and returns how many it deleted.
func sweepUsed(ctx context.Context, storage certmagic.Storage, now time.Time) (int, error) {
	keys, err := storage.List(ctx, usedPrefix, false)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	for _, key := range keys {
		data, err := storage.Load(ctx, key)
		if err != nil {
			continue
		}
		var exp int64
		if json.Unmarshal(data, &exp) == nil && now.Unix() < exp {
			continue
		}
		if storage.Delete(ctx, key) == nil {
			n++
		}
	}
	return n, nil
}
