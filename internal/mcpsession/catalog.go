package mcpsession

import (
	"bytes"
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

// Tool returns the upstream's definition of the tool name, or nil when it
// has not been seen.
func (s *Session) Tool(name string) *ToolDefinition {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.catalog == nil {
		return nil
	}
	return s.catalog.Tools[name]
}

// ToolsListed records the tools' definitions (by name) as the upstream
// just listed them to the runner, where they differ from those known: the
// runner's listing is the latest, and a call is decided (and its tool's
// pin checked) with the definition the runner was shown. A listing makes
// one new catalog, whatever number of its tools changed.
func (s *Session) ToolsListed(tools map[string][]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := make(map[string][]byte, len(tools))
	for name, raw := range tools {
		if s.catalog == nil || s.catalog.Tools[name] == nil || !bytes.Equal(s.catalog.Tools[name].Raw, raw) {
			changed[name] = raw
		}
	}
	if len(changed) > 0 {
		s.catalog = s.catalog.With(changed)
	}
}

// ListingTools marks the upstream's tool list as being fetched here: calls
// waiting for a catalog (WaitCatalog) wait until CatalogListed or
// CatalogFailed, and what another replica stored meanwhile does not end the
// wait. It reports false when a listing was under way here already.
func (s *Session) ListingTools() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listingHere || s.closed {
		return false
	}
	if s.catalogPending == nil {
		s.catalogPending = make(chan struct{})
	}
	s.listingHere = true
	return true
}

// CatalogFailed ends a listing that did not succeed; the definitions known
// before (if any) stay.
func (s *Session) CatalogFailed() {
	s.mu.Lock()
	s.endListingLocked()
	s.mu.Unlock()
}

func (s *Session) endListingLocked() {
	if s.catalogPending != nil {
		close(s.catalogPending)
		s.catalogPending = nil
	}
	s.listingHere = false
}

// setCatalogLocked replaces the known tool definitions and ends the
// listing awaited.
func (s *Session) setCatalogLocked(c *mcpstate.Catalog) {
	s.catalog = c
	s.endListingLocked()
}

// HasCatalog reports whether the upstream's tools were listed.
func (s *Session) HasCatalog() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.catalog != nil
}

// catalogPoll is how often a call waiting for another replica's tool
// listing reads the session again, with a storage that announces nothing.
const catalogPoll = 50 * time.Millisecond
