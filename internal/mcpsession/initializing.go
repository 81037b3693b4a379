package mcpsession

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"time"

	"github.com/caddyserver/certmagic"

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
const initializingPrefix = mcpstate.Prefix + "/initializing"

type reservation struct {
	Until time.Time `json:"until"`
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
	// wrote its index entry before its reservation went.
	r, err := reservations(ctx, c.State.Storage(), user, except)
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

// reservations counts user's reservations that still hold, but except's,
// and removes those past their deadline.
func reservations(ctx context.Context, storage certmagic.Storage, user, except string) (int, error) {
	keys, err := storage.List(ctx, path.Join(initializingPrefix, callerHash(user)), false)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, t := 0, now()
	for _, key := range keys {
		if path.Base(key) == except {
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
		n++
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
