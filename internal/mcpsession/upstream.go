package mcpsession

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpstate"
)

// A session's upstream session: recorded once the runner's initialize
// opened it (in the shared storage, for every replica), and replaced when
// the upstream forgot it, by one request on one replica.

// SetUpstream records the upstream state of a session the runner just
// initialized, in the shared storage: from then on any replica serves the
// session. It fails when the session was closed meanwhile, the storage
// is unavailable, or the initialize outlasted the slot Create reserved and
// the caller has no room any more (*LimitError); the caller then ends u
// upstream. It also fails, with ErrClosed, ending the session, when the
// configuration in force names another upstream for the session's service
// than u's: one that moved it while the runner's initialize ran (its
// EndMoved found the session without an upstream yet).
func (s *Session) SetUpstream(ctx context.Context, u Upstream) error {
	var err error
	if s.local {
		err = s.setLocalUpstream(u)
	} else {
		err = s.storeUpstream(ctx, u)
	}
	if err != nil {
		return err
	}
	return s.m.endIfMoved(ctx, s)
}

// endIfMoved ends s, whose first upstream was just recorded, when moved
// says so, and then returns ErrClosed (the runner initializes anew).
func (m *Sessions) endIfMoved(ctx context.Context, s *Session) error {
	if !m.moved(s) {
		return nil
	}
	if _, _, err := m.End(ctx, s); err != nil {
		return err
	}
	m.logger().Info("ended an MCP session initialized with its service's former upstream", zap.String("service", s.Service))
	return ErrClosed
}

// moved reports whether the configuration in force for good (not one
// Caddy may still abandon, see Detach) names another upstream for s's
// service than the one s recorded, or no such service. Checked after s
// recorded its upstream: a Detach that saw no upstream recorded marked its
// configuration detached before, so this sees it in force for good.
func (m *Sessions) moved(s *Session) bool {
	c := m.cfg()
	if c == nil || c.Endpoint == nil || c.previous != nil && !c.previous.detached.Load() {
		return false
	}
	up := s.Upstream()
	if up.Endpoint == "" {
		return false
	}
	ep, ok := c.Endpoint(s.Service)
	return !ok || !up.From(ep)
}

// storeUpstream is SetUpstream for a session kept in the shared storage.
func (s *Session) storeUpstream(ctx context.Context, u Upstream) error {
	if s.Closed() {
		return ErrClosed
	}
	rec := &mcpstate.Record{Ref: s.Ref, User: s.User, Service: s.Service, Created: s.Created, Expires: s.Expires,
		Upstream:   mcpstate.Upstream{SessionID: u.SessionID, ProtocolVersion: u.ProtocolVersion, Generation: 1, Endpoint: u.Endpoint, Grant: u.Grant},
		Initialize: u.InitializeParams}
	c := s.m.cfg()
	u.Generation = 1
	// Stored under the caller's lock, and its reservation removed with it:
	// no count sees the session half stored, or not at all.
	return s.m.callerLocked(ctx, c, s.User, func() error {
		if err := s.m.reservedStill(ctx, c, s); err != nil {
			return err
		}
		w, err := c.State.Create(ctx, rec)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrStorageUnavailable, err)
		}
		s.unreserve(ctx)
		s.marked.Store(w)
		// Marked stored in the same step as the closed check: a session
		// closed from now on is stored for End, which deletes its record.
		s.mu.Lock()
		closed := s.closed
		if !closed {
			s.upstream, s.stored = u, true
		}
		s.mu.Unlock()
		if !closed {
			return nil
		}
		// Closed while it was being stored (an End found nothing stored
		// to delete): the record would be nobody's, yet counted in its
		// caller's max_mcp_sessions_per_caller until the idle sweep.
		// Ended before the caller's lock goes, so no count sees it.
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := c.State.End(ectx, s.Ref, false); err != nil && !errors.Is(err, mcpstate.ErrNotFound) {
			c.Logger.Warn("ending an MCP session closed while it was stored; it is swept when idle", zap.Error(err))
		}
		return ErrClosed
	})
}

// setLocalUpstream records u as the next generation of a local session.
func (s *Session) setLocalUpstream(u Upstream) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	u.Generation = s.upstream.Generation + 1
	if u.InitializeParams == nil {
		u.InitializeParams = s.upstream.InitializeParams
	}
	if s.upstream.Generation > 0 {
		u.Endpoint, u.Grant = s.upstream.Endpoint, s.upstream.Grant // the same upstream and connection, initialized again
	}
	s.upstream = u
	return nil
}

// errGenerationMoved: another replica re-initialized the upstream session.
var errGenerationMoved = errors.New("re-initialized elsewhere")

// Reinitialize runs init to replace the upstream session seen at generation
// gen, unless another request — here or on another replica — already did
// so; concurrent callers here share the outcome. Waiting for another
// re-initialization honours ctx. A closed session is never re-initialized:
// ErrClosed; and when it is ended while init runs (on any
// replica), the new upstream session is handed to discard (which ends it)
// instead of being kept. The new state is stored under the session's
// storage lock, so replicas racing keep one and discard the others.
func (s *Session) Reinitialize(ctx context.Context, gen uint64, init func(Upstream) (Upstream, error), discard func(Upstream)) (Upstream, error) {
	select {
	case s.reinit <- struct{}{}:
	case <-ctx.Done():
		return s.Upstream(), fmt.Errorf("waiting for the upstream session to be re-created: %w", ctx.Err())
	}
	defer func() { <-s.reinit }()
	if s.Closed() {
		return s.Upstream(), ErrClosed
	}
	cur := s.Upstream()
	if cur.Generation != gen {
		return cur, nil
	}
	if s.local {
		next, err := init(cur)
		if err != nil {
			return cur, err
		}
		if err := s.setLocalUpstream(next); err != nil {
			discard(next)
			return cur, err
		}
		if gen == 0 { // its first upstream: as SetUpstream
			if err := s.m.endIfMoved(ctx, s); err != nil {
				discard(next)
				return cur, err
			}
		}
		return s.Upstream(), nil
	}
	if err := s.m.reload(ctx, s); err != nil {
		return s.Upstream(), err
	}
	if cur = s.Upstream(); cur.Generation != gen {
		return cur, nil // another replica did it
	}
	next, err := init(cur)
	if err != nil {
		return cur, err
	}
	if s.Closed() {
		// Closed here meanwhile (ended, or retired on this replica with its
		// record kept for the others): next is stored nowhere, and ended.
		// Once stored, next is the record's, and kept.
		discard(next)
		return cur, ErrClosed
	}
	s.own.Add(1)
	rec, err := s.m.state().Update(ctx, s.Ref, func(r *mcpstate.Record) error {
		if r.Upstream.Generation != gen {
			return errGenerationMoved
		}
		r.Upstream = mcpstate.Upstream{SessionID: next.SessionID, ProtocolVersion: next.ProtocolVersion, Generation: gen + 1, Endpoint: r.Upstream.Endpoint, Grant: r.Upstream.Grant}
		return nil
	})
	if err != nil {
		s.own.Add(-1)
		discard(next)
		switch {
		case errors.Is(err, mcpstate.ErrNotFound):
			s.m.closeLocal(s)
			return cur, ErrClosed
		case errors.Is(err, errGenerationMoved):
			s.apply(rec, nil, s.changeCount(), nil, false)
			return s.Upstream(), nil
		}
		return cur, fmt.Errorf("%w: %v", ErrStorageUnavailable, err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return cur, ErrClosed // the record names next: the other replicas use it
	}
	next.InitializeParams = cur.InitializeParams
	next.Generation = gen + 1
	next.Endpoint, next.Grant = rec.Upstream.Endpoint, rec.Upstream.Grant
	s.upstream = next
	s.mu.Unlock()
	return next, nil
}
