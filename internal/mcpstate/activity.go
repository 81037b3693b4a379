package mcpstate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"time"

	"github.com/caddyserver/certmagic"
)

// Windows are named by their start, in Unix milliseconds.

func (s *Store) windowOf(t time.Time) int64 {
	w := s.window.Milliseconds()
	if w <= 0 {
		w = 1
	}
	ms := t.UnixMilli()
	return ms - ms%w
}

func activeKey(window int64, ref string) string {
	return path.Join(activePrefix, strconv.FormatInt(window, 10), ref)
}

func parseWindow(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }

// Mark records that the session ref was used in the current window, unless
// known says it was marked for this window already (by this replica, or by
// another whose announcement arrived). The mark of the window known names
// is deleted, so a session has about one mark at a time. It returns the
// window now known.
func (s *Store) Mark(ctx context.Context, ref string, known int64) (int64, error) {
	w := s.windowOf(s.now())
	if known >= w {
		return known, nil
	}
	if err := s.storage.Store(ctx, activeKey(w, ref), nil); err != nil {
		return known, fmt.Errorf("marking the MCP session used: %w", err)
	}
	if known > 0 {
		_ = s.storage.Delete(ctx, activeKey(known, ref)) // a leftover is removed by the sweep
	}
	s.watch.Changed(ctx, activeKey(w, ref))
	return w, nil
}

// Sweep ends the sessions whose newest mark is older than idle, unless
// inUse says this replica uses one (an open stream whose mark is on its
// way). Only one replica sweeps at a time (the storage's try-lock, when it
// has one); another that tries meanwhile sweeps nothing. It returns the
// records of the sessions it ended, for their upstream sessions to be
// ended too. It reads only windows that are old, so its cost follows the
// sessions that went idle.
func (s *Store) Sweep(ctx context.Context, idle time.Duration, inUse func(ref string) bool) ([]*Record, error) {
	if tl, ok := s.storage.(certmagic.TryLocker); ok {
		const name = "toolgate_mcp_sweep"
		got, err := tl.TryLock(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("sweeping MCP sessions: %w", err)
		}
		if !got {
			return nil, nil
		}
		defer func() {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = s.storage.Unlock(uctx, name)
		}()
	}
	dirs, err := s.storage.List(ctx, activePrefix, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, s.sweepCatalogs(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("sweeping MCP sessions: %w", err)
	}
	cutoff := s.now().Add(-idle - s.window).UnixMilli()
	var old, recent []int64
	for _, d := range dirs {
		w, err := parseWindow(path.Base(d))
		switch {
		case err != nil:
			_ = s.storage.Delete(ctx, d) // not a window
		case w < cutoff:
			old = append(old, w)
		default:
			recent = append(recent, w)
		}
	}
	slices.Sort(old)
	var ended []*Record
	for _, w := range old {
		refs, err := s.storage.List(ctx, path.Join(activePrefix, strconv.FormatInt(w, 10)), false)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return ended, fmt.Errorf("sweeping MCP sessions: %w", err)
		}
		for _, k := range refs {
			ref := path.Base(k)
			alive, err := s.markedSince(ctx, ref, recent)
			if err != nil {
				return ended, fmt.Errorf("sweeping MCP sessions: %w", err)
			}
			if !alive && inUse(ref) {
				// In use here, its mark on its way: marked now, so that
				// it still expires if this replica dies before marking.
				if err := s.storage.Store(ctx, activeKey(s.windowOf(s.now()), ref), nil); err != nil {
					return ended, fmt.Errorf("sweeping MCP sessions: %w", err)
				}
				alive = true
			}
			if alive {
				_ = s.storage.Delete(ctx, k)
				continue
			}
			rec, err := s.End(ctx, ref, false)
			switch {
			case err == nil:
				ended = append(ended, rec)
			case !errors.Is(err, ErrNotFound):
				return ended, err
			}
			_ = s.storage.Delete(ctx, k)
		}
		if err := s.storage.Delete(ctx, path.Join(activePrefix, strconv.FormatInt(w, 10))); err != nil {
			return ended, fmt.Errorf("sweeping MCP sessions: %w", err)
		}
	}
	return ended, s.sweepCatalogs(ctx)
}

// markedSince reports whether ref has a mark in one of the windows.
func (s *Store) markedSince(ctx context.Context, ref string, windows []int64) (bool, error) {
	for _, w := range windows {
		_, err := s.storage.Stat(ctx, activeKey(w, ref))
		switch {
		case err == nil:
			return true, nil
		case !errors.Is(err, fs.ErrNotExist):
			return false, err
		}
	}
	return false, nil
}
