package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
)

// The file_system storage's locks, as certmagic's FileStorage makes them
// (a file locks/<name>.lock created exclusively, holding {"created",
// "updated"}, refreshed every 5 s and stale after 10 s without a refresh),
// so that processes locking with FileStorage itself and these exclude each
// other. They differ in what FileStorage gets wrong for locks taken and
// released many times a second (a caller's MCP sessions, approvals):
//   - its refresher outlives the lock: it stops only when it finds no lock
//     file, so with the name locked again meanwhile it refreshed the next
//     holder's file, and such refreshers piled up (thousands of goroutines,
//     each rewriting and syncing the file every 5 s) and logged errors at
//     each one they found being written;
//   - a waiter polled once a second: a lock held for a millisecond cost
//     the next replica a second.
//
// Here a lock's refresher belongs to that lock and ends with it, and a
// waiter polls from 10 ms, backing off to 250 ms.
const (
	lockFresh = 5 * time.Second
	lockStale = 2 * lockFresh
)

type lockMeta struct {
	Created time.Time `json:"created,omitempty"`
	Updated time.Time `json:"updated,omitempty"`
}

// fileLocks are the locks one fileSystemStorage holds, by name.
type fileLocks struct {
	mu   sync.Mutex
	held map[string]chan struct{} // closed to stop the lock's refresher
}

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
		case <-time.After(wait + rand.N(wait/2)):
		}
		wait = min(2*wait, 250*time.Millisecond)
	}
}

// TryLock takes the lock name if it is free, and reports whether it did.
func (s *fileSystemStorage) TryLock(_ context.Context, name string) (bool, error) {
	return s.tryLock(name)
}

// Unlock releases the lock name.
func (s *fileSystemStorage) Unlock(_ context.Context, name string) error {
	s.locks.mu.Lock()
	if stop, ok := s.locks.held[name]; ok {
		close(stop)
		delete(s.locks.held, name)
	}
	s.locks.mu.Unlock()
	return os.Remove(s.lockFile(name))
}

func (s *fileSystemStorage) tryLock(name string) (bool, error) {
	file := s.lockFile(name)
	for range 3 { // a stale lock removed, or one released between the two looks
		created, err := createLock(file)
		if err == nil {
			stop := make(chan struct{})
			s.locks.mu.Lock()
			if old, ok := s.locks.held[name]; ok { // taken over from this process's own stale lock
				close(old)
			}
			s.locks.held[name] = stop
			s.locks.mu.Unlock()
			go refreshLock(file, created, stop)
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
		if err := os.Remove(file); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("removing a stale lock file: %w", err)
		}
	}
	return false, nil
}

// createLock creates the lock file, if there is none, and returns it as
// created.
func createLock(file string) (os.FileInfo, error) {
	_ = os.MkdirAll(filepath.Dir(file), 0o700)
	f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t := time.Now()
	if err := json.NewEncoder(f).Encode(lockMeta{Created: t, Updated: t}); err != nil {
		_ = os.Remove(file)
		return nil, err
	}
	return f.Stat()
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

// refreshLock keeps the lock file created fresh until stop closes, or the
// file is not that one any more (another process took it over as stale).
func refreshLock(file string, created os.FileInfo, stop <-chan struct{}) {
	tick := time.NewTicker(lockFresh)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		info, err := os.Stat(file)
		if err != nil || !os.SameFile(info, created) {
			return
		}
		data, _ := json.Marshal(lockMeta{Created: created.ModTime(), Updated: time.Now()})
		if err := os.WriteFile(file, append(data, '\n'), 0o644); err != nil {
			return
		}
	}
}
