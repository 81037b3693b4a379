package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// ErrLockLost is wrapped by Unlock's error when the lock expired while it
// was held (its holder could not renew it in time, for example because
// PostgreSQL was unreachable for longer than the lease) and was released
// or taken by another owner: the critical section was not protected.
var ErrLockLost = errors.New("the lock was lost: its lease expired while it was held")

// heldLock is a lock this process holds.
type heldLock struct {
	token string // the owner token in the locks table
	fence int64
	lease atomic.Int64 // milliseconds
	lost  atomic.Bool

	renewed  chan struct{} // the lease changed: recompute the heartbeat
	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

func (h *heldLock) stopHeartbeat() {
	h.stopOnce.Do(func() { close(h.stop) })
	<-h.done
}

// lockName checks a lock name: any non-empty string PostgreSQL can hold.
func lockName(op, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("postgres storage: %s: empty lock name", op)
	case len(name) > maxKeyLen:
		return fmt.Errorf("postgres storage: %s: lock name longer than %d bytes", op, maxKeyLen)
	}
	if _, err := cleanKey(name); err != nil {
		return fmt.Errorf("postgres storage: %s: lock name %q %v", op, name, err)
	}
	return nil
}

// Lock acquires the lock name, waiting until it is free or expired, or
// until ctx ends. While held, the lock's lease is renewed every third of
// the lease, so it never expires while this process lives and reaches
// PostgreSQL; if the process dies, the lock expires after at most one
// lease. Each acquisition records a new fencing value ([Storage.Fence]).
func (s *Storage) Lock(ctx context.Context, name string) error {
	if err := lockName("locking", name); err != nil {
		return err
	}
	q, err := s.t.ready(ctx)
	if err != nil {
		return err
	}
	wake, unwatch := s.db.getListener().watchLock(s.t.channel, name)
	defer unwatch()
	token := newToken()
	for {
		ok, wait, err := s.acquire(ctx, q, name, token)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		d := min(s.lease()/4, s.maxPoll)
		if wait > 0 && wait < d {
			d = wait
		}
		timer := time.NewTimer(jitter(d))
		select {
		case <-wake:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("postgres storage: waiting for lock %q: %w", name, ctx.Err())
		}
		timer.Stop()
	}
}

// acquireTimeout bounds one acquisition's statement.
const acquireTimeout = 10 * time.Second

// TryLock acquires the lock name if it is free or expired, and reports
// whether it did; it does not wait.
func (s *Storage) TryLock(ctx context.Context, name string) (bool, error) {
	if err := lockName("locking", name); err != nil {
		return false, err
	}
	q, err := s.t.ready(ctx)
	if err != nil {
		return false, err
	}
	ok, _, err := s.acquire(ctx, q, name, newToken())
	return ok, err
}

// acquire makes one attempt. When the lock is held by another owner, wait
// is how long that owner's lease has left (0 if unknown).
//
// The statement runs to its end even if ctx ends meanwhile: cancelled
// half way, PostgreSQL could give the lock to an attempt whose answer is
// lost, which nobody would release before its lease ran out. A lock taken
// for a ctx that ended meanwhile is released at once (and not taken).
func (s *Storage) acquire(ctx context.Context, q *queries, name, token string) (ok bool, wait time.Duration, err error) {
	ok, wait, err = s.acquireWhole(ctx, q, name, token)
	if ok && ctx.Err() != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = s.Unlock(uctx, name)
		return false, 0, fmt.Errorf("postgres storage: locking %q: %w", name, ctx.Err())
	}
	return ok, wait, err
}

func (s *Storage) acquireWhole(ctx context.Context, q *queries, name, token string) (ok bool, wait time.Duration, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), acquireTimeout)
	defer cancel()
	lease := s.lease()
	var fence, left *int64
	err = s.db.do(ctx, func(ctx context.Context) error {
		return s.db.pool.QueryRow(ctx, q.acquire, name, token, lease.Milliseconds()).Scan(&fence, &left)
	})
	if err != nil {
		return false, 0, wrapErr(fmt.Sprintf("locking %q", name), err)
	}
	if fence == nil {
		if left != nil && *left > 0 {
			wait = time.Duration(*left) * time.Millisecond
		}
		return false, wait, nil
	}
	h := &heldLock{
		token:   token,
		fence:   *fence,
		renewed: make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	h.lease.Store(lease.Milliseconds())
	s.t.locksMu.Lock()
	old := s.t.held[name]
	s.t.held[name] = h
	s.t.locksMu.Unlock()
	if old != nil {
		// it expired unnoticed and was taken again: its heartbeat is moot
		old.stopHeartbeat()
	}
	go s.t.heartbeat(q, name, h)
	return true, 0, nil
}

// heartbeat renews h's lease every third of the lease until stopped. A
// renewal that finds the lock no longer h's marks it lost.
func (t *table) heartbeat(q *queries, name string, h *heldLock) {
	defer close(h.done)
	for {
		interval := time.Duration(h.lease.Load()) * time.Millisecond / 3
		timer := time.NewTimer(interval)
		select {
		case <-h.stop:
			timer.Stop()
			return
		case <-h.renewed:
			timer.Stop()
			continue
		case <-timer.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), interval)
		var fence int64
		err := t.db.do(ctx, func(ctx context.Context) error {
			return t.db.pool.QueryRow(ctx, q.renew, name, h.token, h.lease.Load()).Scan(&fence)
		})
		cancel()
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			h.lost.Store(true)
			t.db.logger.Error("storage lock lost: its lease expired and another owner took or released it",
				zap.String("lock", name), zap.Int64("fence", h.fence))
			return
		case err != nil && t.db.isClosed():
			return
		case err != nil:
			t.db.logger.Warn("renewing storage lock failed; retrying",
				zap.String("lock", name), zap.Error(wrapErr("renewing lock", err)))
		}
	}
}

// Unlock releases the lock name, which this process must hold. It fails
// if the lock was lost meanwhile (wrapping [ErrLockLost]) or if PostgreSQL
// cannot be reached (wrapping [ErrUnavailable]; the lock then expires
// after its lease unless Unlock is retried first). Another process's lock
// is never released.
func (s *Storage) Unlock(ctx context.Context, name string) error {
	what := fmt.Sprintf("unlocking %q", name)
	s.t.locksMu.Lock()
	h := s.t.held[name]
	s.t.locksMu.Unlock()
	if h == nil {
		return fmt.Errorf("postgres storage: %s: this process does not hold the lock", what)
	}
	q, err := s.t.ready(ctx)
	if err != nil {
		return err
	}
	h.stopHeartbeat()
	attempts := 0
	var released int64
	err = s.db.do(ctx, func(ctx context.Context) error {
		attempts++
		return s.db.pool.QueryRow(ctx, q.release, name, h.token, s.t.channel, payload(kindLock, s.db.origin, name)).Scan(&released)
	})
	if err != nil {
		return wrapErr(what, err)
	}
	s.t.locksMu.Lock()
	if s.t.held[name] == h {
		delete(s.t.held, name)
	}
	s.t.locksMu.Unlock()
	if released == 1 {
		return nil
	}
	// Not ours any more. After a retried release, the first attempt may
	// have deleted it: only another owner's row proves it was lost.
	var owner string
	var fence int64
	err = s.db.do(ctx, func(ctx context.Context) error {
		return s.db.pool.QueryRow(ctx, q.lockOwner, name).Scan(&owner, &fence)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows) && attempts > 1:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("postgres storage: %s: %w", what, ErrLockLost)
	case err != nil:
		return wrapErr(what, err)
	default:
		return fmt.Errorf("postgres storage: %s: %w (another owner holds it now, fence %d; ours was %d)", what, ErrLockLost, fence, h.fence)
	}
}

// RenewLockLease sets the lease of the held lock name to lease, from now:
// heartbeats renew it for that long from then on. It fails if this process
// does not hold the lock or lost it.
func (s *Storage) RenewLockLease(ctx context.Context, name string, lease time.Duration) error {
	what := fmt.Sprintf("renewing lock %q", name)
	if lease < time.Second {
		return fmt.Errorf("postgres storage: %s: lease %s is shorter than 1s", what, lease)
	}
	s.t.locksMu.Lock()
	h := s.t.held[name]
	s.t.locksMu.Unlock()
	if h == nil || h.lost.Load() {
		return fmt.Errorf("postgres storage: %s: this process does not hold the lock", what)
	}
	q, err := s.t.ready(ctx)
	if err != nil {
		return err
	}
	var fence int64
	err = s.db.do(ctx, func(ctx context.Context) error {
		return s.db.pool.QueryRow(ctx, q.renew, name, h.token, lease.Milliseconds()).Scan(&fence)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		h.lost.Store(true)
		return fmt.Errorf("postgres storage: %s: %w", what, ErrLockLost)
	}
	if err != nil {
		return wrapErr(what, err)
	}
	h.lease.Store(lease.Milliseconds())
	select {
	case h.renewed <- struct{}{}:
	default:
	}
	return nil
}

// Fence returns the fencing value of the lock name if this process holds
// it. Every acquisition of any lock of the table draws a larger value than
// all before it, so a resource that remembers the largest fence it has
// seen can refuse a write from a holder whose lock has since expired.
func (s *Storage) Fence(name string) (int64, bool) {
	s.t.locksMu.Lock()
	h := s.t.held[name]
	s.t.locksMu.Unlock()
	if h == nil || h.lost.Load() {
		return 0, false
	}
	return h.fence, true
}

// releaseAll releases every lock this process holds in the table (the pool
// is closing: nothing can be written under them any more). Best effort:
// a lock that cannot be deleted expires after its lease.
func (t *table) releaseAll() {
	t.locksMu.Lock()
	held := t.held
	t.held = make(map[string]*heldLock)
	t.locksMu.Unlock()
	q := t.q.Load()
	for name, h := range held {
		h.stopHeartbeat()
		if q == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var n int64
		err := t.db.pool.QueryRow(ctx, q.release, name, h.token, t.channel, payload(kindLock, t.db.origin, name)).Scan(&n)
		cancel()
		if err != nil {
			t.db.logger.Warn("releasing storage lock at shutdown failed; it expires after its lease",
				zap.String("lock", name), zap.Error(wrapErr("releasing lock", err)))
		}
	}
}

// newToken returns a fresh owner token: 128 random bits.
func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
