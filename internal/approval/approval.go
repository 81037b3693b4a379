// Package approval turns a policy's ask into a human decision. An ask
// creates an approval record in the gateway's storage — who asked, in which
// toolgate session, which service, method and tool, the arguments as they
// would go upstream (sealed by the cipher, with a masked copy for the
// approver) and their canonical SHA-256, the decision, and who may decide —
// which a person approves or denies in the console or through the API. The
// identical call, retried, is evaluated by the policy again; when it asks
// again, the approval decides: an approval for scope once lets exactly one
// identical call through (consumed under the storage's lock, so across
// replicas too), scope session every identical call in that toolgate
// session until the approval expires, and scope tool (where the policy
// offers it) any arguments of that tool in that session. A denial answers
// identical retries until it expires. An approval never authorizes other
// arguments, another session or another caller.
//
// An ask of the result policy withholds the result: it is sealed with the
// approval, and approving releases exactly that result to the identical
// retry without calling the upstream again.
package approval

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/gateway"
)

// now is the clock; tests replace it.
var now = time.Now

// States of an approval. Expiry is not a stored state: a pending or
// approved (not consumed) approval past its ExpiresAt is expired.
const (
	StatePending  = "pending"
	StateApproved = "approved"
	StateDenied   = "denied"
	StateConsumed = "consumed"
	StateExpired  = "expired"
)

// Stages an approval is asked at.
const (
	StageRequest = "request"
	StageResult  = "result"
)

// Approval is one approval record. It holds no secret in the clear: the
// arguments (and a withheld result) are sealed by the cipher.
type Approval struct {
	ID        string `json:"id"`
	State     string `json:"state"`
	Stage     string `json:"stage"`
	Requester string `json:"requester"`
	Session   string `json:"session"` // the toolgate session's ref, never its id
	// StoredSession says Session names a stored session, which its
	// person can end before the approval expires: an approved approval
	// of an ended one can no longer be used, and gives its place back
	// (see CountPending). Implied sessions end only at their expiry.
	StoredSession   bool     `json:"stored_session,omitempty"`
	Service         string   `json:"service"`
	Method          string   `json:"method"`
	Tool            string   `json:"tool,omitempty"`
	ArgumentsSHA256 string   `json:"arguments_sha256"`
	DecisionID      string   `json:"decision_id"`
	Reason          string   `json:"reason,omitempty"`
	Revision        string   `json:"revision,omitempty"`
	Approvers       []string `json:"approvers,omitempty"`
	ApproverGroups  []string `json:"approver_groups,omitempty"`
	// RequesterMayApprove: the requester may decide their own call.
	RequesterMayApprove bool      `json:"requester_may_approve"`
	Scopes              []string  `json:"scopes"`
	InBand              bool      `json:"in_band,omitempty"`
	CreatedAt           time.Time `json:"created_at"`
	ExpiresAt           time.Time `json:"expires_at"`
	Scope               string    `json:"scope,omitempty"` // chosen by the approver
	DecidedBy           string    `json:"decided_by,omitempty"`
	DecidedGroups       []string  `json:"decided_groups,omitempty"` // the decider's groups then
	DecidedAt           time.Time `json:"decided_at,omitzero"`
	Note                string    `json:"note,omitempty"`
	ConsumedAt          time.Time `json:"consumed_at,omitzero"`
	CallKey             string    `json:"call_key"`
	ToolKey             string    `json:"tool_key"`
	// Sealed holds the sealed contents in records written before they were
	// kept apart (ContentsSHA256); empty in newer ones.
	Sealed []byte `json:"sealed"`
	// ContentsSHA256 names the sealed contents kept under their own key
	// (listings read records without them): the SHA-256 of the sealed
	// bytes, so that other contents put there are not this approval's.
	ContentsSHA256 string `json:"contents_sha256,omitempty"`
	// MAC authenticates every other field (see Store.sign): a record
	// someone changed in storage — a pending approval made approved, a
	// withheld result moved to another requester — is no approval.
	MAC []byte `json:"mac,omitempty"`
}

// HasContents reports whether the approval still holds what it is about
// (the arguments, and a withheld result): an expired one loses them.
func (a *Approval) HasContents() bool { return len(a.Sealed) > 0 || a.ContentsSHA256 != "" }

// Status is the approval's state as people see it: expired when its time
// is up before it was used.
func (a *Approval) Status() string {
	if (a.State == StatePending || a.State == StateApproved) && !now().Before(a.ExpiresAt) {
		return StateExpired
	}
	return a.State
}

// Contents is what an approval seals: the arguments as they would go
// upstream, the same masked for people (the policy's
// data.toolgate.log.mask), and a withheld result.
type Contents struct {
	Arguments    json.RawMessage `json:"arguments,omitempty"`
	Masked       json.RawMessage `json:"masked,omitempty"`
	Result       json.RawMessage `json:"result,omitempty"`
	MaskedResult json.RawMessage `json:"masked_result,omitempty"`
}

// Errors of deciding an approval. Their texts are safe to show.
var (
	ErrNotFound  = errors.New("no such approval")
	ErrForbidden = errors.New("you may not decide this approval")
	ErrDecided   = errors.New("this approval was already decided")
	ErrExpired   = errors.New("this approval has expired")
	ErrScope     = errors.New("the policy does not offer that scope for this approval")
	ErrNote      = errors.New("the note is longer than 1000 characters")
)

// Store keeps approvals in the gateway's storage, sealed by its cipher.
// Each record is authenticated with an HMAC under a key of the approvals'
// own, kept in storage sealed by the cipher: whoever can write the storage
// but holds no key of the cipher can delete approvals, not decide them.
type Store struct {
	storage certmagic.Storage
	cipher  gateway.Cipher
	logger  *zap.Logger
	// sessionEnded reports whether a person's stored session (by ref) is
	// known to have ended; nil: never.
	sessionEnded func(ctx context.Context, user, ref string) bool

	keyMu  sync.Mutex
	macKey []byte // nil until read (or made) through the cipher

	orphanMu sync.Mutex
	orphans  map[string]bool // contents without a record at the last sweep
}

// NewStore returns the approvals of app's storage.
func NewStore(app *gateway.App) *Store {
	return &Store{storage: app.Storage(), cipher: app.Cipher(), logger: app.Logger().Named("approvals"),
		sessionEnded: app.Sessions().RefEnded}
}

// macKeyName is where the records' HMAC key is kept, sealed by the cipher.
const macKeyName = "toolgate/approvals-key"

var macKeyContext = []byte("toolgate/v1/approvals-key")

// key returns the records' HMAC key: read and opened once, or made (under
// a lock, so that replicas agree on one) when there is none yet.
func (s *Store) key(ctx context.Context) ([]byte, error) {
	s.keyMu.Lock()
	defer s.keyMu.Unlock()
	if s.macKey != nil {
		return s.macKey, nil
	}
	sealed, err := s.storage.Load(ctx, macKeyName)
	if errors.Is(err, fs.ErrNotExist) {
		unlock, lerr := s.lock(ctx, "toolgate_approvals_key")
		if lerr != nil {
			return nil, lerr
		}
		defer unlock()
		if sealed, err = s.storage.Load(ctx, macKeyName); errors.Is(err, fs.ErrNotExist) {
			fresh := make([]byte, 32)
			_, _ = rand.Read(fresh)
			if sealed, err = s.cipher.Encrypt(ctx, fresh, macKeyContext); err != nil {
				return nil, fmt.Errorf("sealing the approvals' key: %w", err)
			}
			if err = s.storage.Store(ctx, macKeyName, sealed); err != nil {
				return nil, fmt.Errorf("%w: storing the approvals' key: %v", gateway.ErrStorageUnavailable, err)
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: reading the approvals' key: %v", gateway.ErrStorageUnavailable, err)
	}
	key, err := s.cipher.Decrypt(ctx, sealed, macKeyContext)
	if err != nil {
		return nil, fmt.Errorf("opening the approvals' key: %w", err)
	}
	s.macKey = key
	return key, nil
}

// sign is a's MAC: an HMAC-SHA256 of its JSON without the MAC.
func sign(key []byte, a *Approval) ([]byte, error) {
	unsigned := *a
	unsigned.MAC = nil
	data, err := json.Marshal(&unsigned)
	if err != nil {
		return nil, err
	}
	h := hmac.New(sha256.New, key)
	h.Write(data)
	return h.Sum(nil), nil
}

const (
	prefix            = "toolgate/approvals"
	byCallPrefix      = "toolgate/approvals-by-call"
	byToolPrefix      = "toolgate/approvals-by-tool"
	pendingPrefix     = "toolgate/approvals-pending"
	byRequesterPrefix = "toolgate/approvals-by-requester"
	// pendingOfPrefix indexes each requester's approvals that hold what
	// they are about (the sealed arguments, and a withheld result) and may
	// still be used: pending, or approved and neither used up nor expired.
	// max_pending_per_user bounds them, and so what one person's calls
	// keep in the storage.
	pendingOfPrefix = "toolgate/approvals-pending-of"
	contentsPrefix  = "toolgate/approvals-contents"
	// keep is how long decided and expired approvals stay listed.
	keep = 24 * time.Hour
	// writeTimeout bounds the writes that make or decide an approval,
	// which go on after the request that started them ends.
	writeTimeout = 30 * time.Second
)

// stamp is an expiry as index entries and marks keep it: to the
// nanosecond, since one truncated to the second would count an approval
// of a short ttl as expired up to a second early (time.Parse with
// time.RFC3339 reads both).
func stamp(t time.Time) []byte { return []byte(t.UTC().Format(time.RFC3339Nano)) }

func hashOf(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

func recordKey(id string) string { return path.Join(prefix, id) }

func contentsKey(id string) string { return path.Join(contentsPrefix, id) }

// validID reports whether id could be an approval's (gateway.NewID: at most
// 64 characters of the base64url alphabet).
func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func cipherContext(id string) []byte { return []byte("toolgate/v1/approval/" + id) }

// Call is a call as approvals match it: the same requester, toolgate
// session, service, method and tool, and canonically equal arguments.
type Call struct {
	Requester string
	Session   string // the toolgate session's ref
	// SessionStored says the session is a stored one (POST /v1/sessions),
	// whose end the approvals can see (see Approval.StoredSession).
	SessionStored bool
	Service       string
	Method        string
	Tool          string
	Arguments     []byte // as they would go upstream
	// Within, when set, narrows the call to a context its arguments do
	// not name: for a request naming a task, the MCP session the task was
	// created in (a task id is the upstream's, and may be unique only in
	// that session).
	Within string
}

// Keys returns the call's key (everything, arguments included), its tool
// key (everything but the arguments) and the arguments' canonical SHA-256.
func (c Call) Keys() (callKey, toolKey, digest string) {
	sum := sha256.Sum256(Canonical(c.Arguments))
	digest = hex.EncodeToString(sum[:])
	toolKey = hashOf(c.Requester, c.Session, c.Service, c.Method, c.Tool)
	if c.Within != "" {
		toolKey = hashOf(toolKey, c.Within)
	}
	return hashOf(toolKey, digest), toolKey, digest
}

// Canonical re-encodes JSON with object keys sorted and no insignificant
// space, so that a retry spelled differently matches; text that is not
// JSON is returned as it is.
func Canonical(raw []byte) []byte {
	if len(bytes.TrimSpace(raw)) == 0 {
		return []byte("null")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return raw
	}
	out, err := json.Marshal(v)
	if err != nil {
		return raw
	}
	return out
}

// Create stores a new pending approval with its sealed contents, which
// are kept under a key of their own: listings and lookups read the small
// record, and only a page showing the approval (or a release) reads what
// it is about.
func (s *Store) Create(ctx context.Context, a *Approval, c Contents) error {
	// Written whole even if the runner gives up meanwhile: a half-made
	// approval would be contents nobody sweeps, or one not counted.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	// Counted first (max_pending_per_user): an entry whose record never
	// came is dropped when counted (CountPending).
	pendingOf := path.Join(pendingOfPrefix, hashOf(a.Requester), a.ID)
	if err := s.storage.Store(ctx, pendingOf, stamp(a.ExpiresAt)); err != nil {
		return fmt.Errorf("%w: indexing the approval: %v", gateway.ErrStorageUnavailable, err)
	}
	plain, err := json.Marshal(c)
	if err != nil {
		return err
	}
	sealed, err := s.cipher.Encrypt(ctx, plain, cipherContext(a.ID))
	clear(plain)
	if err != nil {
		return fmt.Errorf("sealing the approval: %w", err)
	}
	if err := s.storage.Store(ctx, contentsKey(a.ID), sealed); err != nil {
		return fmt.Errorf("%w: storing the approval: %v", gateway.ErrStorageUnavailable, err)
	}
	sum := sha256.Sum256(sealed)
	a.Sealed, a.ContentsSHA256 = nil, hex.EncodeToString(sum[:])
	if err := s.save(ctx, a); err != nil {
		return err
	}
	for _, key := range []string{
		path.Join(byCallPrefix, a.CallKey, a.ID),
		path.Join(pendingPrefix, a.ID),
		path.Join(byRequesterPrefix, hashOf(a.Requester), a.ID),
	} {
		if err := s.storage.Store(ctx, key, stamp(a.ExpiresAt)); err != nil {
			return fmt.Errorf("%w: indexing the approval: %v", gateway.ErrStorageUnavailable, err)
		}
	}
	return nil
}

func (s *Store) save(ctx context.Context, a *Approval) error {
	key, err := s.key(ctx)
	if err != nil {
		return err
	}
	// Signed as it will read back: JSON writes text that is not UTF-8 as
	// U+FFFD, which reads back as that character, so the record is first
	// made what a reader will see.
	a.MAC = nil
	raw, err := json.Marshal(a)
	if err != nil {
		return err
	}
	var canon Approval
	if err := json.Unmarshal(raw, &canon); err != nil {
		return err
	}
	*a = canon
	if a.MAC, err = sign(key, a); err != nil {
		return err
	}
	data, err := json.Marshal(a)
	if err != nil {
		return err
	}
	if err := s.storage.Store(ctx, recordKey(a.ID), data); err != nil {
		return fmt.Errorf("%w: storing the approval: %v", gateway.ErrStorageUnavailable, err)
	}
	return nil
}

// Get returns the approval with id. An id comes from a URL: anything but
// an id's characters (such as "..", a directory of the storage) names no
// approval.
func (s *Store) Get(ctx context.Context, id string) (*Approval, error) {
	a, err := s.read(ctx, id)
	if err != nil {
		return nil, err
	}
	key, err := s.key(ctx)
	if err != nil {
		return nil, err
	}
	if want, err := sign(key, a); err != nil || !hmac.Equal(want, a.MAC) {
		s.logger.Warn("an approval record in storage does not carry its MAC: it was changed outside toolgate (or written before records were signed), and is ignored",
			zap.String("approval", id))
		return nil, ErrNotFound
	}
	return a, nil
}

// read returns the record with id as stored, not checked.
func (s *Store) read(ctx context.Context, id string) (*Approval, error) {
	if !validID(id) {
		return nil, ErrNotFound
	}
	data, err := s.storage.Load(ctx, recordKey(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("%w: reading the approval: %v", gateway.ErrStorageUnavailable, err)
	}
	var a Approval
	if err := json.Unmarshal(data, &a); err != nil || a.ID != id {
		return nil, ErrNotFound
	}
	return &a, nil
}

// Open returns what a is sealed with.
func (s *Store) Open(ctx context.Context, a *Approval) (Contents, error) {
	var c Contents
	sealed := a.Sealed
	if len(sealed) == 0 {
		if a.ContentsSHA256 == "" {
			return c, errors.New("opening the approval: its contents are gone (it expired)")
		}
		var err error
		if sealed, err = s.storage.Load(ctx, contentsKey(a.ID)); err != nil {
			return c, fmt.Errorf("%w: reading the approval's contents: %v", gateway.ErrStorageUnavailable, err)
		}
		if sum := sha256.Sum256(sealed); hex.EncodeToString(sum[:]) != a.ContentsSHA256 {
			return c, errors.New("opening the approval: its contents in storage are not the ones it was made with")
		}
	}
	plain, err := s.cipher.Decrypt(ctx, sealed, cipherContext(a.ID))
	if err != nil {
		return c, fmt.Errorf("opening the approval: %w", err)
	}
	err = json.Unmarshal(plain, &c)
	clear(plain)
	return c, err
}

// list returns the approvals whose ids are the last elements of the keys
// under dir, newest first.
func (s *Store) list(ctx context.Context, dir string) ([]*Approval, error) {
	keys, err := s.storage.List(ctx, dir, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: listing approvals: %v", gateway.ErrStorageUnavailable, err)
	}
	var out []*Approval
	for _, key := range keys {
		a, err := s.Get(ctx, path.Base(key))
		if errors.Is(err, ErrNotFound) {
			_ = s.storage.Delete(ctx, key) // an index entry left by a sweep
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(x, y *Approval) int { return y.CreatedAt.Compare(x.CreatedAt) })
	return out, nil
}

// ForCall returns the approvals of the identical call (callKey) and the
// tool-scope approvals of the same tool in the same session (toolKey).
func (s *Store) ForCall(ctx context.Context, callKey, toolKey string) ([]*Approval, error) {
	exact, err := s.list(ctx, path.Join(byCallPrefix, callKey))
	if err != nil {
		return nil, err
	}
	tool, err := s.list(ctx, path.Join(byToolPrefix, toolKey))
	if err != nil {
		return nil, err
	}
	return append(exact, tool...), nil
}

// Pending returns the approvals waiting for a decision, newest first.
func (s *Store) Pending(ctx context.Context) ([]*Approval, error) {
	all, err := s.list(ctx, pendingPrefix)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(a *Approval) bool { return a.Status() != StatePending }), nil
}

// OfRequester returns user's approvals, newest first.
func (s *Store) OfRequester(ctx context.Context, user string) ([]*Approval, error) {
	return s.list(ctx, path.Join(byRequesterPrefix, hashOf(user)))
}

// MayDecide reports whether caller may decide a: the requester when the
// policy lets them, anyone the policy names by user or group.
func (a *Approval) MayDecide(caller *gateway.Caller) bool {
	if caller.User == a.Requester {
		return a.RequesterMayApprove
	}
	if slices.Contains(a.Approvers, caller.User) {
		return true
	}
	for _, g := range caller.Groups {
		if slices.Contains(a.ApproverGroups, g) {
			return true
		}
	}
	return false
}

// DecidedUnder reports whether a's decider may decide an ask of a's
// requester made with spec: an approval covers a later ask (another call
// of the tool, for scope tool) only then, so that approving one's own call
// never lets through a call the policy leaves to others (four eyes).
func (a *Approval) DecidedUnder(spec Spec) bool {
	asked := Approval{Requester: a.Requester, RequesterMayApprove: spec.RequesterMayApprove,
		Approvers: spec.Approvers.Users, ApproverGroups: spec.Approvers.Groups}
	return asked.MayDecide(&gateway.Caller{User: a.DecidedBy, Groups: a.DecidedGroups})
}

// Covers reports whether the approved a covers an ask made with spec: its
// decider may decide it (DecidedUnder), a scope wider than once is one the
// ask offers too, and a is not older than the ask's ttl — whether or not
// the policy changed since a was given: a policy whose approval object
// depends on the call (a large payment offered only once, a small one for
// the tool) is followed call by call, and a policy that narrows its
// approvals narrows those already given.
func (a *Approval) Covers(spec Spec) bool {
	if !a.DecidedUnder(spec) {
		return false
	}
	if a.Scope != ScopeOnce && a.Scope != "" && !slices.Contains(spec.Scopes, a.Scope) {
		return false
	}
	return spec.TTL <= 0 || now().Before(a.CreatedAt.Add(spec.TTL))
}

// About reports whether a is an approval of call c: of the identical call
// (the arguments as they would go upstream now), or, for scope tool, of
// any call of its tool in its session. Covers says whether a still
// stands under the policy; About, whether it is this call's at all: a call
// whose arguments a newer revision of the policy rewrote is another call.
func (a *Approval) About(c Call) bool {
	callKey, toolKey, _ := c.Keys()
	return a.CallKey == callKey || a.Scope == ScopeTool && a.ToolKey == toolKey
}

// AsksLike reports whether a pending a leaves its decision to exactly the
// people spec does. Only then does an identical ask wait for a instead of
// asking anew: a call the policy now leaves to admins must not run on an
// approval its requester may give because an earlier policy let them.
func (a *Approval) AsksLike(spec Spec) bool {
	same := func(x, y []string) bool {
		x, y = slices.Clone(x), slices.Clone(y)
		slices.Sort(x)
		slices.Sort(y)
		return slices.Equal(slices.Compact(x), slices.Compact(y))
	}
	return a.RequesterMayApprove == spec.RequesterMayApprove &&
		same(a.Approvers, spec.Approvers.Users) && same(a.ApproverGroups, spec.Approvers.Groups)
}

// Decide approves (with scope) or denies the approval id for caller, with
// a note. It holds the approval's storage lock, so two deciders on two
// replicas cannot both decide it.
func (s *Store) Decide(ctx context.Context, id string, caller *gateway.Caller, approve bool, scope, note string) (*Approval, error) {
	// Who may decide it is fixed when it is made: someone who may not is
	// refused before the lock (a bulk decision names up to 100 ids).
	if a, err := s.Get(ctx, id); err != nil {
		return nil, err
	} else if !a.MayDecide(caller) {
		return nil, ErrForbidden
	}
	var out *Approval
	err := s.locked(ctx, id, func(a *Approval) (bool, error) {
		if !a.MayDecide(caller) {
			return false, ErrForbidden
		}
		switch a.Status() {
		case StatePending:
		case StateExpired:
			return false, ErrExpired
		default:
			return false, ErrDecided
		}
		if approve {
			if scope == "" {
				scope = a.Scopes[0]
			}
			if !slices.Contains(a.Scopes, scope) {
				return false, ErrScope
			}
			a.State, a.Scope = StateApproved, scope
		} else {
			// Nothing will open what it was about any more: the record
			// is kept without it (its requester could otherwise ask and
			// deny at once, again and again, each time leaving
			// max_request_size of sealed arguments for a day; see
			// Consume).
			a.State = StateDenied
			a.Sealed, a.ContentsSHA256 = nil, ""
		}
		a.DecidedBy, a.DecidedGroups, a.DecidedAt, a.Note = caller.User, caller.Groups, now().UTC(), note
		out = a
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	// The decision is made: its indexes follow even if the decider gives
	// up now (an entry left behind is dropped when counted or swept).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	if out.State == StateDenied {
		// Else removed with the record, a day later. An approved one
		// keeps its contents, and its place among its requester's, until
		// it is used up or expires.
		s.dropContents(ctx, out)
	}
	_ = s.storage.Delete(ctx, path.Join(pendingPrefix, id))
	if out.State == StateApproved && out.Scope == ScopeTool {
		if err := s.storage.Store(ctx, path.Join(byToolPrefix, out.ToolKey, id), stamp(out.ExpiresAt)); err != nil {
			return nil, fmt.Errorf("%w: indexing the approval: %v", gateway.ErrStorageUnavailable, err)
		}
	}
	return out, nil
}

// Consume uses up an approval of scope once (or a released result): it
// reports whether this caller got it. Exactly one of any number of
// concurrent callers, on any replica, does. A used-up approval no longer
// holds what it was about (a requester who may approve their own asks
// could otherwise ask, approve and retry again and again, each time
// leaving max_request_size of sealed arguments, and a result, for a day):
// whoever releases a withheld result opens it before (see
// Manager.release).
func (s *Store) Consume(ctx context.Context, id string) (*Approval, bool, error) {
	var got *Approval
	err := s.locked(ctx, id, func(a *Approval) (bool, error) {
		if a.Status() != StateApproved {
			return false, nil
		}
		a.State, a.ConsumedAt = StateConsumed, now().UTC()
		a.Sealed, a.ContentsSHA256 = nil, ""
		got = a
		return true, nil
	})
	if got != nil && err == nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		defer cancel()
		s.dropContents(ctx, got)
	}
	return got, got != nil, err
}

// locked runs change on the approval id under its storage lock and stores
// it when change says so.
func (s *Store) locked(ctx context.Context, id string, change func(*Approval) (bool, error)) error {
	unlock, err := s.lock(ctx, "toolgate_approval_"+hashOf(id))
	if err != nil {
		return err
	}
	defer unlock()
	a, err := s.Get(ctx, id)
	if err != nil {
		return err
	}
	save, err := change(a)
	if err != nil || !save {
		return err
	}
	return s.save(ctx, a)
}

// lock takes the storage lock name, waiting at most 10 seconds, and
// returns its release.
func (s *Store) lock(ctx context.Context, name string) (func(), error) {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.storage.Lock(lctx, name); err != nil {
		return nil, fmt.Errorf("%w: locking approvals: %v", gateway.ErrStorageUnavailable, err)
	}
	return func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = s.storage.Unlock(uctx, name)
	}, nil
}

// CountPending counts user's approvals that hold their place under
// max_pending_per_user (pending, or approved and not used up; see
// pendingOfPrefix) and have not expired, dropping the index entries of
// those that have (or are gone).
func (s *Store) CountPending(ctx context.Context, user string) (int, error) {
	dir := path.Join(pendingOfPrefix, hashOf(user))
	keys, err := s.storage.List(ctx, dir, false)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("%w: listing approvals: %v", gateway.ErrStorageUnavailable, err)
	}
	n := 0
	for _, key := range keys {
		raw, err := s.storage.Load(ctx, key)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("%w: reading approvals: %v", gateway.ErrStorageUnavailable, err)
		}
		if expires, err := time.Parse(time.RFC3339, string(raw)); err != nil || !now().Before(expires) {
			_ = s.storage.Delete(ctx, key)
			continue
		}
		// Only an approval that may still be used counts: an entry left
		// by a denial, a use or a creation cut short names none.
		switch a, err := s.Get(ctx, path.Base(key)); {
		case errors.Is(err, ErrNotFound) || (err == nil && a.Status() != StatePending && a.Status() != StateApproved):
			_ = s.storage.Delete(ctx, key)
		case err != nil:
			return 0, err
		case a.Status() == StateApproved && a.StoredSession && s.sessionEnded != nil && s.sessionEnded(ctx, a.Requester, a.Session):
			// Approved for calls of a session that has ended: nothing
			// can use it any more.
			if _, err := s.clearContents(ctx, a.ID, StateApproved); err == nil {
				_ = s.storage.Delete(ctx, key) // also when it held nothing any more
			}
		default:
			n++
		}
	}
	return n, nil
}

// clearContents drops what the approval id is about (its sealed
// arguments and a withheld result), and its place among its requester's,
// when, read again under its lock, its status is still status and it holds
// them — an approval whose time is up (expired), or that can no longer be
// used (approved, its session ended); its record stays, without them. It
// returns the record so cleared, or nil: a replica whose clock is behind
// may have used the approval meanwhile, or another dropped them.
func (s *Store) clearContents(ctx context.Context, id, status string) (*Approval, error) {
	var cleared *Approval
	err := s.locked(ctx, id, func(cur *Approval) (bool, error) {
		if cur.Status() != status || !cur.HasContents() {
			return false, nil
		}
		cur.Sealed, cur.ContentsSHA256, cleared = nil, "", cur
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if cleared != nil {
		s.dropContents(ctx, cleared)
	}
	return cleared, nil
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
