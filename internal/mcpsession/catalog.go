package mcpsession

import (
	"context"
	"errors"
	"time"

	"github.com/toolgate/toolgate/internal/mcpstate"
)

// The upstream's tool definitions as a session's listing last gave them,
// shared with the other replicas.

// errCatalogUnchanged: the record names the catalog already.
var errCatalogUnchanged = errors.New("catalog unchanged")

// CatalogListed replaces the known tool definitions (name → the tool
// object's JSON text) and ends the listing in progress. The catalog is
// stored for the other replicas, once per distinct catalog; an error says
// it could not be, and the definitions then serve this replica only.
func (s *Session) CatalogListed(ctx context.Context, tools map[string][]byte) error {
	if s.local {
		catalog, _ := mcpstate.NewCatalog(tools)
		s.mu.Lock()
		s.setCatalogLocked(catalog)
		s.mu.Unlock()
		return nil
	}
	catalog, err := s.m.state().PutCatalog(ctx, tools)
	if err != nil {
		catalog, _ = mcpstate.NewCatalog(tools)
	}
	s.mu.Lock()
	s.setCatalogLocked(catalog)
	stored := s.stored
	s.mu.Unlock()
	if err != nil || !stored {
		return err
	}
	s.own.Add(1)
	_, err = s.m.state().Update(ctx, s.Ref, func(r *mcpstate.Record) error {
		if r.Catalog == catalog.Hash {
			return errCatalogUnchanged
		}
		r.Catalog = catalog.Hash
		return nil
	})
	if err != nil {
		s.own.Add(-1)
		if errors.Is(err, errCatalogUnchanged) || errors.Is(err, mcpstate.ErrNotFound) {
			return nil
		}
	}
	return err
}

// WaitCatalog waits, at most max, for a tool listing in progress — here, or
// on another replica the runner's notifications/initialized reached (the
// first one is expected from the session's start) — so that a call racing
// it is decided with the tool's definition. It reports whether the catalog
// is known. A wait that runs out ends the pending listing, so that later
// calls of a runner that never sent notifications/initialized do not wait.
func (s *Session) WaitCatalog(ctx context.Context, max time.Duration) bool {
	s.mu.Lock()
	pending, here := s.catalogPending, s.listingHere
	s.mu.Unlock()
	if pending == nil {
		return s.HasCatalog()
	}
	t := time.NewTimer(max)
	defer t.Stop()
	var poll <-chan time.Time
	if !here && !s.m.state().Watch().Live() {
		// Nothing will be announced: read the record now and then.
		tick := time.NewTicker(catalogPoll)
		defer tick.Stop()
		poll = tick.C
	}
	for {
		select {
		case <-pending:
		case <-t.C:
			s.mu.Lock()
			if s.catalogPending == pending {
				s.endListingLocked()
				s.catalogGivenUp = true
			}
			s.mu.Unlock()
		case <-ctx.Done():
		case <-s.ctx.Done():
		case <-poll:
			_ = s.m.reload(ctx, s)
			continue
		}
		return s.HasCatalog()
	}
}
