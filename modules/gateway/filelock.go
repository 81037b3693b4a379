package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// The file_system storage's locks, as certmagic's FileStorage makes them
// (a file locks/<name>.lock created exclusively, holding {"created",
// "updated"}, refreshed every 5 s and stale after 10 s without a refresh),
// so that processes locking with FileStorage itself and these exclude each
// other. They differ in what FileStorage gets wrong for locks taken and
// released many times a second (a caller's MCP sessions, approvals), and
// for replicas taking over a stale lock at once:
//   - its refresher outlives the lock: it stops only when it finds no lock
//     file, so with the name locked again meanwhile it refreshed the next
//     holder's file, and such refreshers piled up (thousands of goroutines,
//     each rewriting and syncing the file every 5 s); one between its look
//     and its write recreated a file just released;
//   - its Unlock removes whatever file has the name: the next holder's,
//     when this one's was taken over as stale;
//   - replicas that found a lock stale each removed the file and created
//     their own, so a later one removed an earlier one's fresh lock: two
//     holders;
//   - a waiter polled once a second: a lock held for a millisecond cost
//     the next replica a second.
//
// Here each lock file also names its holder (a random token, which
// FileStorage ignores); a lock's refresher belongs to that lock, writes
// into the file it opened only while it names that holder, and ends
// before Unlock returns; Unlock removes only its own file; a stale lock is
// taken over by one replica at a time (the one holding
// <name>.lock.takeover, see holdTakeover), and Unlock too looks and
// removes as the one holding that file; and a waiter polls from 10 ms, backing off to 250 ms.
//
// What no lease can rule out stays: a holder paused past 10 s (a stopped
// process, a suspended machine) loses its lock to the next replica without
// knowing it until its Unlock, which then reports the lock lost. And a
// replica paused in the microseconds it holds a takeover file keeps that
// one lock, once stale, from being taken over until it resumes or ends
// (on NFSv4, until the file server ends its lease): breaking the flock of
// a live replica is what let two replicas take one lock over.
const (
	lockFresh = 5 * time.Second
	lockStale = 2 * lockFresh
)

type lockMeta struct {
	Created time.Time `json:"created,omitempty"`
	Updated time.Time `json:"updated,omitempty"`
	// Holder tells this lock apart from every other of its name.
	Holder string `json:"holder,omitempty"`
}

// lockTimeLayout writes a lock file's times at one width: UTC, with all
// nine digits of the fraction (RFC 3339, as FileStorage reads them).
const lockTimeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// encode returns the lock file's text, a line of JSON as long as every
// other of its holder's: a refresh rewrites the file in place (see
// refreshOnce), and another replica reads it without a lock. Times
// written as encoding/json writes them (trailing zeros of the fraction
// dropped) made one refresh longer or shorter than the last, and a read
// during the rewrite then found a text cut short or torn, which
// FileStorage cannot parse.
func (m lockMeta) encode() []byte {
	b := make([]byte, 0, 128)
	b = append(b, `{"created":"`...)
	b = m.Created.UTC().AppendFormat(b, lockTimeLayout)
	b = append(b, `","updated":"`...)
	b = m.Updated.UTC().AppendFormat(b, lockTimeLayout)
	b = append(b, '"')
	if m.Holder != "" {
		b = append(b, `,"holder":`...)
		b = mcpmsg.AppendQuote(b, m.Holder)
	}
	return append(b, "}\n"...)
}

// fileLocks are the locks one fileSystemStorage holds, by name. Each name
// is held at most once: the certmagic.Locker contract pairs each Lock with
// one Unlock, which releases the name as this storage holds it.
type fileLocks struct {
	mu   sync.Mutex
	held map[string]*heldLock
}

type heldLock struct {
	holder  string
	created time.Time
	// file is the lock file created, open until Unlock (on Windows,
	// where an open file cannot be removed, a holder paused past 10 s
	// keeps its lock from a takeover until it resumes).
	file *os.File
	stop chan struct{} // closed by Unlock
	done chan struct{} // closed when the refresher ended
}

// lockFile is the file of the lock name. Names alike once made safe
// (case, spaces) share one, and are one lock.
func (s *fileSystemStorage) lockFile(name string) string {
	return filepath.Join(s.Path, "locks", certmagic.StorageKeys.Safe(name)+".lock")
}

// Lock takes the lock name, waiting for it until ctx ends.
func (s *fileSystemStorage) Lock(ctx context.Context, name string) error {
	wait := 10 * time.Millisecond
	for {
		ok, err := s.tryLock(name)
		if ok || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait + mrand.N(wait/2)):
		}
		wait = min(2*wait, 250*time.Millisecond)
	}
}

// TryLock takes the lock name if it is free, and reports whether it did.
func (s *fileSystemStorage) TryLock(_ context.Context, name string) (bool, error) {
	return s.tryLock(name)
}

// Unlock releases the lock name this storage holds. It removes the lock
// file only if it is still this holder's: the very file it created (kept
// open while held, so that its inode is not reused; a FileStorage
// refresher rewrites it in place, a takeover makes another). One taken
// over meanwhile (this process did not refresh it for 10 s) is the new
// holder's, and Unlock reports the lock lost. It looks and removes as the
// one holding the takeover file, so that no replica takes the lock over
// in between.
func (s *fileSystemStorage) Unlock(_ context.Context, name string) error {
	key := certmagic.StorageKeys.Safe(name)
	s.locks.mu.Lock()
	h, ok := s.locks.held[key]
	delete(s.locks.held, key)
	s.locks.mu.Unlock()
	if !ok {
		return fmt.Errorf("unlocking %q: not locked by this storage", name)
	}
	close(h.stop)
	<-h.done
	file := s.lockFile(name)
	defer h.file.Close()
	got, err := withTakeover(file, time.Second, func() error {
		named, err := os.Stat(file)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("lock %q was lost: its file was removed while held", name)
		case err != nil:
			return fmt.Errorf("reading lock file: %w", err)
		}
		if held, err := h.file.Stat(); err != nil || !os.SameFile(held, named) {
			return fmt.Errorf("lock %q was lost: taken over as stale by another holder (not refreshed for %s)", name, lockStale)
		}
		_ = h.file.Close() // before removing it, as some systems require
		if err := os.Remove(file); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing lock file: %w", err)
		}
		return nil
	})
	switch {
	case !got && errors.Is(err, fs.ErrNotExist):
		// No takeover file can be made: the locks directory is gone, and
		// the lock file with it.
		return fmt.Errorf("lock %q was lost: its file was removed while held (no %s)", name, filepath.Dir(file))
	case err == nil && !got:
		return fmt.Errorf("unlocking %q: another replica kept taking the lock over for a second; its file stays, and is taken over as stale in %s", name, lockStale)
	}
	return err
}

func (s *fileSystemStorage) tryLock(name string) (bool, error) {
	key := certmagic.StorageKeys.Safe(name) // names alike once safe share a file
	s.locks.mu.Lock()
	_, mine := s.locks.held[key]
	s.locks.mu.Unlock()
	if mine {
		return false, nil // refreshed by its holder here, whose Unlock frees it
	}
	file := s.lockFile(name)
	for range 3 { // a stale lock removed, or one released between the two looks
		h, err := createLock(file)
		if err == nil {
			s.locks.mu.Lock()
			s.locks.held[key] = h
			s.locks.mu.Unlock()
			go h.refresh(file)
			return true, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return false, fmt.Errorf("creating lock file: %w", err)
		}
		switch stale, err := lockIsStale(file); {
		case errors.Is(err, fs.ErrNotExist):
			continue // released meanwhile
		case err != nil:
			return false, fmt.Errorf("reading lock file: %w", err)
		case !stale:
			return false, nil
		}
		if removed, err := takeOver(file); err != nil || !removed {
			return false, err
		}
	}
	return false, nil
}

// takeOver removes the stale lock file, as the one replica holding its
// takeover file: another replica that found it stale too, a moment later,
// would otherwise remove the fresh file of the replica that took it over
// first. It reports false when another replica is taking it over, or the
// lock is no longer stale.
func takeOver(file string) (bool, error) {
	removed := false
	_, err := withTakeover(file, 0, func() error {
		switch stale, err := lockIsStale(file); { // again, as the only one taking it over
		case errors.Is(err, fs.ErrNotExist):
			removed = true
			return nil
		case err != nil:
			return fmt.Errorf("reading lock file: %w", err)
		case !stale:
			return nil
		}
		if err := os.Remove(file); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing a stale lock file: %w", err)
		}
		removed = true
		return nil
	})
	return removed && err == nil, err
}

// withTakeover runs fn as the one replica holding the lock file's
// takeover file (holdTakeover), waiting up to wait for it. It reports
// false, without running fn, when another holds it longer.
func withTakeover(file string, wait time.Duration, fn func() error) (bool, error) {
	marker := takeoverFile(file)
	deadline := time.Now().Add(wait)
	for {
		release, ok, err := holdTakeover(marker)
		if err != nil {
			return false, fmt.Errorf("taking the lock takeover file: %w", err)
		}
		if ok {
			defer release()
			return true, fn()
		}
		if !time.Now().Before(deadline) {
			return false, nil
		}
		time.Sleep(time.Millisecond)
	}
}

// takeoverFile names the lock file's takeover file: <name>.lock.takeover,
// or, where that would pass the file system's 255 bytes, a hash of the
// lock file's name with .takeover (which no lock file ends with).
func takeoverFile(file string) string {
	base := filepath.Base(file)
	name := base + ".takeover"
	if len(name) > 255 {
		sum := sha256.Sum256([]byte(base))
		name = hex.EncodeToString(sum[:16]) + ".takeover"
	}
	return filepath.Join(filepath.Dir(file), name)
}

// createLock creates the lock file, if there is none, for a new holder.
func createLock(file string) (*heldLock, error) {
	_ = os.MkdirAll(filepath.Dir(file), 0o700)
	f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	t := time.Now()
	h := &heldLock{holder: rand.Text(), created: t, file: f, stop: make(chan struct{}), done: make(chan struct{})}
	if _, err := f.Write(lockMeta{Created: t, Updated: t, Holder: h.holder}.encode()); err != nil {
		_ = f.Close()
		_ = os.Remove(file)
		return nil, err
	}
	return h, nil
}

func readLock(file string) (lockMeta, error) {
	var meta lockMeta
	data, err := os.ReadFile(file)
	if err == nil {
		err = json.Unmarshal(data, &meta)
	}
	return meta, err
}

// lockIsStale reports whether the lock file was last refreshed longer
// than lockStale ago. A file being written (empty or cut short) is judged
// by its time of change.
func lockIsStale(file string) (bool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return false, err
	}
	var meta lockMeta
	if json.Unmarshal(data, &meta) != nil {
		info, err := os.Stat(file)
		if err != nil {
			return false, err
		}
		return time.Since(info.ModTime()) > lockStale, nil
	}
	ref := meta.Updated
	if ref.IsZero() {
		ref = meta.Created
	}
	return time.Since(ref) > lockStale, nil
}

// refresh keeps the lock's file fresh until Unlock stops it, or the file
// is not this holder's any more (another replica took it over as stale).
func (h *heldLock) refresh(file string) {
	defer close(h.done)
	tick := time.NewTicker(lockFresh)
	defer tick.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-tick.C:
		}
		if !h.refreshOnce(file) {
			return
		}
	}
}

// refreshOnce rewrites the lock file with the time of now, in the file it
// opened and found this holder's: never a file created meanwhile (it does
// not create one), nor another holder's. It reports false when the file is
// gone or another holder's; a file it could not read or parse (being
// written by FileStorage's refresher, see owns) is left for the next tick.
func (h *heldLock) refreshOnce(file string) bool {
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	var meta lockMeta
	if err != nil || json.Unmarshal(data, &meta) != nil {
		return true
	}
	if !h.owns(meta) {
		return false
	}
	data = lockMeta{Created: h.created, Updated: time.Now(), Holder: h.holder}.encode()
	if _, err := f.WriteAt(data, 0); err != nil {
		return true
	}
	_ = f.Truncate(int64(len(data)))
	return true
}

// owns reports whether the lock file read is this holder's. A certmagic
// FileStorage replica that held the name just before leaves a refresher
// asleep for up to 5 s, which then rewrites the next holder's file with
// only its "created" and "updated": a file naming no holder, created when
// this one was, is this one's (and its next refresh names it again).
func (h *heldLock) owns(meta lockMeta) bool {
	return meta.Holder == h.holder || meta.Holder == "" && meta.Created.Equal(h.created)
}
