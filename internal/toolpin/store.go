package toolpin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/internal/storecache"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Record is what toolgate knows of one tool's pin: the digest of the
// definition it accepted (first seen, or accepted by an administrator),
// and a change it saw since, waiting for an administrator.
type Record struct {
	Service string `json:"service"`
	Tool    string `json:"tool"`
	// Digest is the accepted definition's: first seen, accepted by an
	// administrator, or named by the registry's pin line when the tool was
	// last checked (while there is a pin line, it is what counts; once it
	// is removed, the tool stays pinned to the digest it named). Records
	// of earlier versions have "" for a registry-pinned tool.
	Digest string `json:"digest,omitempty"`
	// Registry is the digest the registry's pin line named when toolgate
	// last saw one ("" if never): a pin line naming another one is a new
	// acceptance (see Pins.registryPinMoved); one that still names it, on
	// a replica whose configuration is older, is none.
	Registry string    `json:"registry,omitempty"`
	Since    time.Time `json:"since"`
	// AcceptedBy is the administrator who accepted Digest; "" for a
	// definition pinned at first sight.
	AcceptedBy string `json:"accepted_by,omitempty"`
	// Definition is the pinned definition as the upstream sent it, for
	// comparing a change with.
	Definition json.RawMessage `json:"definition,omitempty"`
	// Changed is the latest other definition the upstream showed, hidden
	// until accepted.
	Changed *Change `json:"changed,omitempty"`
	// Replaced are the digests of the definitions an administrator's
	// acceptances and the registry's pin lines replaced, the newest last
	// (at most maxReplaced): what a session listed before Since may still
	// hold (see Pins.check). "unknown" stands for a registry pin a record
	// of an earlier version did not keep: any digest.
	Replaced []string `json:"replaced,omitempty"`
}

// acceptedAfter reports whether r's pin was accepted after loaded (when a
// configuration was loaded): by an administrator through the API, or by a
// pin line of a newer configuration. A pin of first sight is no
// acceptance: a pin line overrides it whenever it was loaded.
func (r *Record) acceptedAfter(loaded time.Time) bool {
	return (r.AcceptedBy != "" || r.Registry != "") && loaded.Before(r.Since)
}

// unknownReplaced in Record.Replaced is a replaced digest not known.
const unknownReplaced = "unknown"

// replaced reports whether digest is one that r's acceptances or pin lines
// replaced.
func (r *Record) replaced(digest string) bool {
	return slices.Contains(r.Replaced, digest) || slices.Contains(r.Replaced, unknownReplaced)
}

// maxReplaced bounds Record.Replaced: acceptances are an administrator's
// rare acts, and a session listed before the oldest one kept would record
// that definition as a change again.
const maxReplaced = 64

// Change is a definition that differs from the pinned one.
type Change struct {
	Digest string    `json:"digest"`
	SeenAt time.Time `json:"seen_at"`
	// Definition is the tool as the upstream sent it, for the
	// administrator to read before accepting it.
	Definition json.RawMessage `json:"definition"`
	// ShownTo are the callers whose own listing showed them the pinned
	// definition since this one was seen, on a service with per-user
	// credentials: they may go on calling the pinned definition (see
	// Pins.check). Each is the SHA-256 of the caller's name, in hex,
	// truncated to 128 bits; at most maxShownTo.
	ShownTo []string `json:"shown_to,omitempty"`
}

// maxShownTo bounds Change.ShownTo; when it is full it starts again, and
// the callers list the tools again before calling the tool.
const maxShownTo = 1024

// listerOf is how Change.ShownTo names user.
func listerOf(user string) string {
	sum := sha256.Sum256([]byte(user))
	return hex.EncodeToString(sum[:16])
}

func (c *Change) shownTo(who string) bool { return slices.Contains(c.ShownTo, who) }

// store keeps records in the gateway's storage, one per service and tool
// (under the SHA-256 of the tool's name, which may hold any character),
// read through a cache that follows the changes other replicas announce
// (internal/storecache): a change seen or accepted through one replica
// applies on every other at once (with storages that announce nothing,
// within cache_ttl).
type store struct {
	storage certmagic.Storage
	watch   *storecache.Watch
	cache   *storecache.Cache[*Record] // nil: no record
}

func newStore(storage certmagic.Storage, cacheTTL time.Duration) *store {
	w := storecache.NewWatch(storage, prefix)
	return &store{storage: storage, watch: w, cache: storecache.NewCache[*Record](w, cacheTTL, time.Now)}
}

// pinKey identifies a record: its service, and the SHA-256 of its tool's
// name (bounded, whatever the name).
type pinKey struct {
	service string
	tool    [sha256.Size]byte
}

func keyOf(service, tool string) pinKey {
	return pinKey{service: service, tool: sha256.Sum256([]byte(tool))}
}

// storageKey is where k's record is stored.
func (k pinKey) storageKey() string {
	return path.Join(prefix, k.service, hex.EncodeToString(k.tool[:]))
}

const prefix = "toolgate/tool-pins"

// get returns the record of service's tool, nil when there is none.
func (s *store) get(ctx context.Context, service, tool string) (*Record, error) {
	stored := keyOf(service, tool).storageKey()
	return s.cache.Load(ctx, stored, func(ctx context.Context) (*Record, bool, error) {
		rec, err := s.load(ctx, stored)
		return rec, err == nil, err // no record is kept too: its first sight is announced
	})
}

func (s *store) load(ctx context.Context, key string) (*Record, error) {
	data, err := s.storage.Load(ctx, key)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: reading a tool pin: %v", gateway.ErrStorageUnavailable, err)
	}
	rec := new(Record)
	if err := json.Unmarshal(data, rec); err != nil {
		return nil, fmt.Errorf("reading a tool pin: %v", err)
	}
	rec.migrate()
	return rec, nil
}

// migrate brings the digests of a record made by a version that pinned no
// member of a tool's _meta up to Digest's, from the definitions it kept:
// the pin covers the _meta of the very definition that was pinned (or
// that waits), not whatever the upstream shows after the upgrade. A
// digest without its definition (a pin line's, a record that kept none)
// stays: a definition with pinned members of _meta differs from it, as a
// change an administrator reads (see Verdict.Reason).
func (r *Record) migrate() {
	if r.Definition != nil && r.Digest != "" && r.Digest == digestWithoutMeta(r.Definition) {
		r.Digest = Digest(r.Definition)
	}
	if c := r.Changed; c != nil && c.Definition != nil && c.Digest == digestWithoutMeta(c.Definition) {
		c.Digest = Digest(c.Definition)
	}
}

// update changes the record of service's tool under the storage's lock,
// reading it afresh first: change gets the current record (nil for none)
// and returns the record to store, or nil to store nothing.
func (s *store) update(ctx context.Context, service, tool string, change func(*Record) *Record) (*Record, error) {
	key := keyOf(service, tool)
	stored := key.storageKey()
	lock := strings.ReplaceAll(stored, "/", "-")
	if err := s.storage.Lock(ctx, lock); err != nil {
		return nil, fmt.Errorf("%w: locking a tool pin: %v", gateway.ErrStorageUnavailable, err)
	}
	defer func() { _ = s.storage.Unlock(context.WithoutCancel(ctx), lock) }()
	cur, err := s.load(ctx, stored)
	if err != nil {
		return nil, err
	}
	next := change(cur)
	if next == nil {
		return cur, nil
	}
	data, err := json.Marshal(next)
	if err != nil {
		return nil, err
	}
	if err := s.storage.Store(ctx, stored, data); err != nil {
		return nil, fmt.Errorf("%w: storing a tool pin: %v", gateway.ErrStorageUnavailable, err)
	}
	s.cache.Wrote(ctx, stored, next)
	return next, nil
}

// list returns every record, by service and tool.
func (s *store) list(ctx context.Context) ([]*Record, error) {
	keys, err := s.storage.List(ctx, prefix, true)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: listing tool pins: %v", gateway.ErrStorageUnavailable, err)
	}
	var out []*Record
	for _, key := range keys {
		if strings.Count(strings.TrimPrefix(key, prefix+"/"), "/") != 1 {
			continue // a service's directory
		}
		rec, err := s.load(ctx, key)
		if err != nil {
			return nil, err
		}
		if rec != nil {
			out = append(out, rec)
		}
	}
	return out, nil
}
