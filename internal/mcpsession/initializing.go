package mcpsession

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpstate"
	"github.com/toolgate/toolgate/internal/written"
)

// An initialize in flight holds a slot of its caller's
// max_mcp_sessions_per_caller: its session is stored only once the
// upstream answered (SetUpstream), and initializes sent at once must not
// all see room for one. The slot is a reservation in the shared storage,
// counted and written under the caller's storage lock, on any replica:
//
//	toolgate/mcp/initializing/<sha256 of user>/<ref>   until when it holds (JSON)
//
// It is removed when the session is stored (under the same lock, so that
// the session counts once or twice meanwhile, never not at all) or the
// initialize fails (End); one that a replica which died, or an initialize
// abandoned, left holds until its deadline.
//
// The sessions a replica holds for the caller and never stores (those it
// implies for stateless requests, CreateLocal) count on every replica
// too: each replica keeps one record of how many it holds, written when
// the count changes (under the same lock) and renewed by Housekeep,
//
//	toolgate/mcp/initializing/<sha256 of user>/held-<replica>   until when it holds, and the count
//
// so that a caller cannot hold max_mcp_sessions_per_caller on each of N
// replicas; a replica that died stops counting once its record runs out.
const initializingPrefix = mcpstate.Prefix + "/initializing"

type reservation struct {
	Until time.Time `json:"until"`
	// Count is how many sessions a replica's record of its local ones
	// stands for (0: a reservation, one).
	Count int `json:"count,omitempty"`
}

// heldName is the name of the record of this replica's local sessions
// (under the caller's reservations).
func (m *Sessions) heldName() string { return "held-" + m.holder }

// heldLease is how long a record of local sessions holds unless renewed
// (Housekeep renews it after a third of that): five minutes, or three
// housekeeping rounds.
func (c *Config) heldLease() time.Duration { return max(5*time.Minute, 3*c.Sweep) }

// storeHeld writes the record of user's local sessions on this replica:
// n of them (none: the record is removed). It runs under the caller's
// lock.
func (m *Sessions) storeHeld(ctx context.Context, c *Config, user string, n int) error {
	key := path.Join(initializingPrefix, callerHash(user), m.heldName())
	if n <= 0 {
		if err := c.State.Storage().Delete(ctx, key); err != nil && !errors.Is(err, fs.ErrNotExist) {
			// Kept in heldAt: Housekeep tries again.
			return fmt.Errorf("%w: recording the caller's MCP sessions: %v", ErrStorageUnavailable, err)
		}
		m.mu.Lock()
		if m.localUser[user] == 0 {
			delete(m.heldAt, user)
		}
		m.mu.Unlock()
		return nil
	}
	data, _ := json.Marshal(reservation{Until: now().Add(c.heldLease()), Count: n})
	if err := c.State.Storage().Store(ctx, key, data); err != nil {
		return fmt.Errorf("%w: recording the caller's MCP sessions: %v", ErrStorageUnavailable, err)
	}
	m.mu.Lock()
	m.heldAt[user] = now()
	m.mu.Unlock()
	return nil
}

// Leaving removes this replica's records of its local sessions, as the
// process exits (gateway.App.Stop, while the storage is still open: it
// may be closed before Destruct runs): the other replicas stop counting
// them at once, not once the records run out.
func (m *Sessions) Leaving(ctx context.Context) {
	c := m.cfg()
	if c == nil {
		return
	}
	m.mu.Lock()
	users := slices.Collect(maps.Keys(m.heldAt))
	m.mu.Unlock()
	for _, user := range users {
		m.mu.Lock()
		m.localUser[user] = 0 // its sessions end with the process
		m.mu.Unlock()
		if err := m.storeHeld(ctx, c, user, 0); err != nil {
			c.Logger.Warn("removing the record of a caller's MCP sessions held here failed; other replicas count them until it runs out", zap.Error(err))
		}
	}
}

// releaseHeld records, in the background, that user holds fewer local
// sessions here now (one ended).
func (m *Sessions) releaseHeld(c *Config, user string) {
	m.goBackground(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := m.callerLocked(ctx, c, user, func() error {
			m.mu.Lock()
			n := m.localUser[user]
			m.mu.Unlock()
			return m.storeHeld(ctx, c, user, n)
		})
		if err != nil { // it counts a session too many until Housekeep writes it again
			c.Logger.Debug("recording the end of a local MCP session failed", zap.Error(err))
		}
	})
}

func callerHash(user string) string {
	sum := sha256.Sum256([]byte(user))
	return hex.EncodeToString(sum[:])
}

func reservationKey(user, ref string) string {
	return path.Join(initializingPrefix, callerHash(user), ref)
}

// callerLocked runs fn holding user's lock (mcpstate.Store.LockedAs: this
// process's callers queue on a mutex, replicas on the storage lock).
// Counting the caller's sessions and storing one happen under it, so that
// no count sees a session half stored (mcpstate.Store.CountUser removes an
// index entry whose record is missing).
func (m *Sessions) callerLocked(ctx context.Context, c *Config, user string, fn func() error) error {
	ran := false
	err := c.State.LockedAs(ctx, "toolgate_mcp_caller_"+callerHash(user), func() error {
		ran = true
		return fn()
	})
	if err != nil && !ran {
		return fmt.Errorf("%w: locking the caller's MCP sessions: %v", ErrStorageUnavailable, err)
	}
	return err
}

// countCaller returns how many sessions user holds, all replicas
// together, initializes in flight included, not counting the reservation
// of except. It runs under the caller's lock.
func (m *Sessions) countCaller(ctx context.Context, c *Config, user, except string) (int, error) {
	m.mu.Lock()
	n := m.localUser[user]
	m.mu.Unlock()
	// Reservations before stored sessions: a session stored meanwhile
	// wrote its index entry before its reservation went. (This replica's
	// record of its local sessions is n.)
	r, err := reservations(ctx, c.State.Storage(), user, except, m.heldName())
	if err != nil {
		return 0, fmt.Errorf("%w: counting MCP sessions: %v", ErrStorageUnavailable, err)
	}
	n += r
	stored, err := c.State.CountUser(ctx, user, c.PerCaller-n)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrStorageUnavailable, err)
	}
	return n + stored, nil
}

// reservations counts user's reservations that still hold (and the local
// sessions other replicas hold), but except's and own's, and removes those
// past their deadline.
func reservations(ctx context.Context, storage certmagic.Storage, user, except, own string) (int, error) {
	keys, err := storage.List(ctx, path.Join(initializingPrefix, callerHash(user)), false)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, t := 0, now()
	for _, key := range keys {
		if base := path.Base(key); base == except || base == own {
			continue
		}
		data, err := storage.Load(ctx, key)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // released meanwhile
		case err != nil:
			return 0, err
		}
		var r reservation
		if json.Unmarshal(data, &r) != nil {
			if written.Recently(ctx, storage, key) {
				n++ // being written
			} else {
				_ = storage.Delete(ctx, key)
			}
			continue
		}
		if t.After(r.Until) {
			_ = storage.Delete(ctx, key) // abandoned
			continue
		}
		n += max(1, r.Count)
	}
	return n, nil
}

// reserve stores the reservation of the session ref, holding until ctx's
// deadline (the initialize's), or a grace period when it has none, and a
// grace period more for clocks that disagree. It runs under the caller's
// lock.
func reserve(ctx context.Context, storage certmagic.Storage, user, ref string) error {
	until := now().Add(written.Grace)
	if d, ok := ctx.Deadline(); ok {
		until = d
	}
	data, _ := json.Marshal(reservation{Until: until.Add(written.Grace)})
	if err := storage.Store(ctx, reservationKey(user, ref), data); err != nil {
		return fmt.Errorf("%w: reserving the MCP session: %v", ErrStorageUnavailable, err)
	}
	return nil
}

// reservedStill checks that s's reservation still holds in storage: when
// it does not (it ran out, or a reload replaced the store), the caller is
// counted again, and a *LimitError says there is no room for s any more.
// It runs under the caller's lock.
func (m *Sessions) reservedStill(ctx context.Context, c *Config, s *Session) error {
	s.mu.Lock()
	reserved := s.reserved
	s.mu.Unlock()
	if reserved == c.State {
		data, err := c.State.Storage().Load(ctx, reservationKey(s.User, s.Ref))
		var r reservation
		if err == nil && json.Unmarshal(data, &r) == nil && now().Before(r.Until) {
			return nil
		}
	}
	n, err := m.countCaller(ctx, c, s.User, s.Ref)
	if err != nil {
		return err
	}
	if n >= c.PerCaller {
		return &LimitError{Option: "max_mcp_sessions_per_caller", Limit: c.PerCaller}
	}
	return nil
}

// unreserve removes s's reservation, if it holds one: its session is
// stored, or will never be.
func (s *Session) unreserve(ctx context.Context) {
	s.mu.Lock()
	st := s.reserved
	s.reserved = nil
	s.mu.Unlock()
	if st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = st.Storage().Delete(ctx, reservationKey(s.User, s.Ref)) // one left runs out
}
