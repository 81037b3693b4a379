package mcpsession

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// Ending sessions from outside a request: those of an ended toolgate
// session, of a service whose upstream moved, of a caller no longer
// allowed, and those idle everywhere (Housekeep, in the background).

// EndOrphans ends the sessions held here that were started in a toolgate
// session for which ended reports true (its person ended it, or it
// expired): everywhere for a stored session, and their upstream sessions
// with the end hook. Ending one stops what it carries — its streams, its
// exchanges in progress, the streams kept for resumption and the calls
// held between rounds —, so nothing its runner started outlives the
// toolgate session. ended is asked once per toolgate session.
func (m *Sessions) EndOrphans(ctx context.Context, ended func(ctx context.Context, toolgateSession string) bool) {
	c := m.cfg()
	if c == nil {
		return
	}
	verdicts := map[string]bool{}
	for _, s := range m.snapshot() {
		if s.Closed() || s.SessionID == "" {
			continue
		}
		gone, asked := verdicts[s.SessionID]
		if !asked {
			gone = ended(ctx, s.SessionID)
			verdicts[s.SessionID] = gone
		}
		if !gone {
			continue
		}
		up, ok, err := m.End(ctx, s)
		if err != nil {
			c.Logger.Warn("ending an MCP session whose toolgate session ended", zap.Error(err))
			continue
		}
		if ok && c.OnEnd != nil {
			c.OnEnd(Ended{ID: s.ID, User: s.User, Service: s.Service, Upstream: up})
		}
	}
}

// EndMoved ends the sessions held here whose service names another
// upstream than the one they were initialized with, or no longer exists
// (endpoint reports the service's Endpoint, and whether it exists): a
// configuration that changed it is in force (see Detach). Their streams and exchanges stop
// with them, so that the old upstream no longer reaches runners through
// them. Their upstream sessions are not ended (no end hook): a DELETE
// would go to the new upstream with the old one's id. A session that
// recorded no endpoint (a federated one, or stored by an older version)
// is left alone.
func (m *Sessions) EndMoved(ctx context.Context, endpoint func(service string) (string, bool)) {
	c := m.cfg()
	if c == nil {
		return
	}
	for _, s := range m.snapshot() {
		up := s.Upstream()
		if s.Closed() || up.Endpoint == "" {
			continue
		}
		if ep, ok := endpoint(s.Service); ok && up.From(ep) {
			continue
		}
		if _, _, err := m.End(ctx, s); err != nil {
			c.Logger.Warn("ending an MCP session whose service's upstream changed", zap.String("service", s.Service), zap.Error(err))
			continue
		}
		c.Logger.Info("ended an MCP session: its service's upstream changed or the service is gone", zap.String("service", s.Service))
	}
}

// EndBarred ends the sessions held here whose caller allows (the
// configuration in force) no longer lets use their service: a reload took
// them off its allowed_users. Their streams and exchanges stop with them,
// as each new request of theirs to the service is refused. Their upstream
// sessions are not ended (no end hook): the upstream forgets them at its
// own idle timeout. nil allows everyone.
func (m *Sessions) EndBarred(ctx context.Context, allows func(service, user string) bool) {
	c := m.cfg()
	if c == nil || allows == nil {
		return
	}
	for _, s := range m.snapshot() {
		if s.Closed() || allows(s.Service, s.User) {
			continue
		}
		if _, _, err := m.End(ctx, s); err != nil {
			c.Logger.Warn("ending an MCP session whose caller the service no longer allows", zap.String("service", s.Service), zap.Error(err))
			continue
		}
		c.Logger.Info("ended an MCP session: the service no longer allows its caller", zap.String("service", s.Service))
	}
}

// Housekeep marks the sessions used since the last run (an open stream is
// use) in the shared storage, re-reads in-use copies that may be stale,
// forgets copies idle here, and sweeps sessions idle everywhere, handing
// their upstream sessions to the end hook. It runs in the background,
// never under a request.
func (m *Sessions) Housekeep(ctx context.Context) {
	c := m.cfg()
	if c == nil {
		return
	}
	t := now()
	m.mu.Lock()
	since := m.lastTick
	m.lastTick = t
	var renew []string
	for user, at := range m.heldAt {
		if t.Sub(at) >= c.heldLease()/3 {
			renew = append(renew, user)
		}
	}
	m.mu.Unlock()
	m.renewHeld(ctx, c, renew)
	for _, s := range m.snapshot() {
		if s.Closed() {
			continue
		}
		inUse := s.inUse.Load() > 0
		last := time.Unix(0, s.lastUsed.Load())
		s.mu.Lock()
		stored := s.stored
		s.mu.Unlock()
		if stored && (inUse || last.After(since)) {
			w, err := c.State.Mark(ctx, s.Ref, s.marked.Load())
			if err != nil {
				c.Logger.Debug("marking an MCP session used failed", zap.Error(err))
			} else if w > s.marked.Load() {
				s.marked.Store(w)
			}
		}
		switch {
		case s.local:
			if !inUse && t.Sub(last) > c.Idle && m.closeLocal(s) && c.OnEnd != nil {
				c.OnEnd(Ended{ID: s.ID, User: s.User, Service: s.Service, Upstream: s.Upstream()})
			}
		case (inUse || s.heldHere.Load() && t.Sub(last) <= c.Idle) && !m.fresh(c, s):
			// An end elsewhere stops its streams here, and ends what a
			// transport module here holds of it (an announcement whose
			// read reloadLater had no room for, or that a lost listening
			// connection missed, is caught here).
			_ = m.reload(ctx, s)
		case !inUse && t.Sub(last) > c.Idle:
			m.closeLocal(s) // idle here; what is shared stays
		}
	}
	ended, err := c.State.Sweep(ctx, c.Idle, func(ref string) bool {
		s := m.lookup(ref)
		return s != nil && s.inUse.Load() > 0
	})
	if err != nil {
		c.Logger.Warn("sweeping idle MCP sessions", zap.Error(err))
	}
	if len(ended) > 0 {
		c.Logger.Debug("expired idle MCP sessions", zap.Int("count", len(ended)))
	}
	for _, rec := range ended {
		id := ""
		if s := m.lookup(rec.Ref); s != nil {
			id = s.ID
			m.closeLocal(s)
		}
		if c.OnEnd != nil {
			c.OnEnd(Ended{ID: id, User: rec.User, Service: rec.Service, Upstream: upstreamOf(rec)})
		}
	}
}
