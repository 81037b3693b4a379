package approval

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"time"

	"go.uber.org/zap"
)

// Sessions that had a result withheld for approval: a retry of a call in
// one of them may find the released result, so the result step looks for
// one only where a mark, here or in storage (for every replica), says so.

// withheldPrefix holds a mark per requester and toolgate session that had
// a result withheld, through any replica: its expiry (RFC 3339).
const withheldPrefix = "toolgate/approvals-withheld"

func withheldKey(user, ref string) string { return path.Join(withheldPrefix, hashOf(user, ref)) }

// noteResult remembers that a's session had a result withheld, here and,
// so that a retry through another replica looks for the released result
// too, in storage (announced).
func (m *Manager) noteResult(ctx context.Context, a *Approval) {
	key := a.Requester + "\x00" + a.Session
	m.mu.Lock()
	if len(m.results) > 10000 {
		for k, until := range m.results {
			if now().After(until) {
				delete(m.results, k)
			}
		}
	}
	later := a.ExpiresAt.After(m.results[key])
	if later {
		m.results[key] = a.ExpiresAt
	}
	m.mu.Unlock()
	if !later || m.withheldCache == nil {
		return
	}
	stored := withheldKey(a.Requester, a.Session)
	wrote, err := m.markWithheld(ctx, stored, a)
	if err != nil {
		m.logger.Warn("cannot mark a withheld result in storage; a retry through another replica calls the upstream again",
			zap.String("approval", a.ID), zap.Error(err))
		return
	}
	if wrote {
		m.withheldCache.Wrote(ctx, stored, a.ExpiresAt)
	}
}

// markWithheld stores a's expiry as the mark at key unless a later one is
// there, reading and writing under the mark's lock: two replicas
// withholding at once would otherwise leave the earlier expiry, and once
// that passed, other replicas would not look for the later result.
func (m *Manager) markWithheld(ctx context.Context, key string, a *Approval) (bool, error) {
	unlock, err := m.Store.lock(ctx, "toolgate_approval_withheld_"+hashOf(a.Requester, a.Session))
	if err != nil {
		return false, err
	}
	defer unlock()
	data, err := m.Store.storage.Load(ctx, key)
	switch {
	case err == nil:
		if t, err := time.Parse(time.RFC3339, string(data)); err == nil && !t.Before(a.ExpiresAt) {
			return false, nil // another replica marked a later expiry
		}
	case !errors.Is(err, fs.ErrNotExist):
		return false, err // a later mark may be there
	}
	return true, m.Store.storage.Store(ctx, key, stamp(a.ExpiresAt))
}

// MayRelease reports whether calls of user in the toolgate session ref may
// have a withheld result waiting: only then does the result step look one
// up before the call goes upstream. A session whose result was withheld
// through another replica is known from its mark in storage, read once
// per session and replica and again when a replica announces a new one
// (with storages that announce nothing, after cache_ttl). When the mark
// cannot be read, the result step looks.
func (m *Manager) MayRelease(ctx context.Context, user, ref string) bool {
	m.mu.Lock()
	until, ok := m.results[user+"\x00"+ref]
	m.mu.Unlock()
	if ok && now().Before(until) {
		return true
	}
	if m.withheldCache == nil {
		return false
	}
	key := withheldKey(user, ref)
	until, err := m.withheldCache.Load(ctx, key, func(ctx context.Context) (time.Time, bool, error) {
		data, err := m.Store.storage.Load(ctx, key)
		if errors.Is(err, fs.ErrNotExist) {
			return time.Time{}, true, nil
		}
		if err != nil {
			return time.Time{}, false, err
		}
		t, err := time.Parse(time.RFC3339, string(data))
		return t, err == nil, nil
	})
	return err != nil || now().Before(until)
}

// sweepWithheld deletes the marks of sessions whose withheld results all
// expired.
func (m *Manager) sweepWithheld(ctx context.Context) {
	keys, err := m.Store.storage.List(ctx, withheldPrefix, false)
	if err != nil {
		return
	}
	for _, key := range keys {
		data, err := m.Store.storage.Load(ctx, key)
		if err != nil {
			continue
		}
		if t, err := time.Parse(time.RFC3339, string(data)); err != nil || now().After(t.Add(keep)) {
			_ = m.Store.storage.Delete(ctx, key)
		}
	}
}
