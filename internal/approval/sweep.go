package approval

import (
	"context"
	"errors"
	"io/fs"
	"path"
)

// Approvals past their time: those that expired, or were decided longer
// ago than keep, are deleted with their sealed contents (and handed back
// for the audit log), and sealed contents whose record is gone (on two
// sweeps in a row) are removed.

// Sweep deletes approvals (and their sealed contents) that expired or were
// decided more than a day ago, and returns them: the caller audits the
// expired ones.
func (s *Store) Sweep(ctx context.Context) ([]*Approval, error) {
	keys, err := s.storage.List(ctx, prefix, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s.sweepContents(ctx)
	var gone []*Approval
	cutoff := now().Add(-keep)
	for _, key := range keys {
		a, err := s.Get(ctx, path.Base(key))
		if errors.Is(err, ErrNotFound) {
			// Not signed (changed outside toolgate, or older than signing):
			// no approval; it goes, with the index entries it names.
			if a, err = s.read(ctx, path.Base(key)); err == nil {
				s.remove(ctx, a)
			}
			continue
		} else if err != nil {
			continue
		}
		last := a.ExpiresAt
		if a.DecidedAt.After(last) {
			last = a.DecidedAt
		}
		if a.Status() == StateExpired && a.HasContents() {
			// What was withheld or asked about is of no use any more.
			if cleared, err := s.clearContents(ctx, a.ID, StateExpired); err == nil && cleared != nil {
				gone = append(gone, cleared)
			}
		}
		if last.After(cutoff) {
			continue
		}
		s.remove(ctx, a)
	}
	return gone, nil
}

// remove deletes a's record and index entries.
func (s *Store) remove(ctx context.Context, a *Approval) {
	for _, k := range []string{recordKey(a.ID), contentsKey(a.ID), path.Join(pendingPrefix, a.ID), path.Join(byCallPrefix, a.CallKey, a.ID),
		path.Join(byToolPrefix, a.ToolKey, a.ID), path.Join(byRequesterPrefix, hashOf(a.Requester), a.ID),
		path.Join(pendingOfPrefix, hashOf(a.Requester), a.ID)} {
		_ = s.storage.Delete(ctx, k)
	}
}

// sweepContents deletes sealed contents whose record is gone (a creation
// cut short, or a record removed by someone who can write the storage).
// Contents are written just before their record, so contents without one
// are deleted only when the previous sweep (a minute earlier, longer than
// a creation may take: writeTimeout) found them without one too — on this
// replica's own observation, whatever the storage's clock or times.
func (s *Store) sweepContents(ctx context.Context) {
	keys, err := s.storage.List(ctx, contentsPrefix, false)
	if err != nil {
		return
	}
	s.orphanMu.Lock()
	defer s.orphanMu.Unlock()
	seen := map[string]bool{}
	for _, key := range keys {
		id := path.Base(key)
		// Stat, not Exists, which answers false when the storage fails:
		// an approval's contents are deleted only when its record is
		// known to be gone.
		if _, err := s.storage.Stat(ctx, recordKey(id)); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if s.orphans[id] {
			_ = s.storage.Delete(ctx, key)
			continue
		}
		seen[id] = true
	}
	s.orphans = seen
}

// dropContents deletes the sealed contents of a (expired, denied or used
// up) and its place among its requester's (see pendingOfPrefix).
func (s *Store) dropContents(ctx context.Context, a *Approval) {
	_ = s.storage.Delete(ctx, contentsKey(a.ID))
	_ = s.storage.Delete(ctx, path.Join(pendingOfPrefix, hashOf(a.Requester), a.ID))
}
