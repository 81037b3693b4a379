package mcpsession

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/toolgate/toolgate/internal/mcpstate"
)

// errLinkTaken: another replica linked another session for the service.
var errLinkTaken = errors.New("link taken")

// Link returns the session linked to s for service (see
// mcpstate.Record.Links), as of this replica's copy of the record.
func (s *Session) Link(service string) (mcpstate.Link, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.links[service]
	return l, ok
}

// Links returns every session linked to s, by service.
func (s *Session) Links() map[string]mcpstate.Link {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.links)
}

// SetLink links l to s for service in place of old (the link read before,
// a zero Link when there was none), in the shared storage. When another
// replica changed the service's link since, nothing is changed and the
// link that holds is returned: the caller uses it and ends the session l
// names. It fails when s was ended (ErrClosed) or the storage is
// unavailable.
func (s *Session) SetLink(ctx context.Context, service string, old, l mcpstate.Link) (mcpstate.Link, error) {
	if s.Closed() {
		return old, ErrClosed
	}
	if s.local {
		s.mu.Lock()
		defer s.mu.Unlock()
		if cur := s.links[service]; cur.ID != old.ID {
			return cur, nil
		}
		s.links = maps.Clone(s.links)
		if s.links == nil {
			s.links = make(map[string]mcpstate.Link)
		}
		s.links[service] = l
		return l, nil
	}
	s.own.Add(1)
	rec, err := s.m.state().Update(ctx, s.Ref, func(r *mcpstate.Record) error {
		if r.Links[service].ID != old.ID {
			return errLinkTaken
		}
		links := maps.Clone(r.Links) // r may be a copy others read
		if links == nil {
			links = make(map[string]mcpstate.Link)
		}
		links[service] = l
		r.Links = links
		return nil
	})
	if err != nil {
		s.own.Add(-1)
		switch {
		case errors.Is(err, mcpstate.ErrNotFound):
			s.m.closeLocal(s)
			return old, ErrClosed
		case errors.Is(err, errLinkTaken):
			s.apply(rec, nil, s.changeCount(), nil, false)
			return rec.Links[service], nil
		}
		return old, fmt.Errorf("%w: %v", ErrStorageUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.links = rec.Links
	return l, nil
}
