//go:build unix

package gateway

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
	"time"
)

// flock locks a takeover file (a variable so that tests can be a file
// system without flock).
var flock = syscall.Flock

// holdTakeover takes the takeover file marker: an exclusive flock on it,
// which the kernel releases when its process ends however it ends, so
// that no takeover file is ever left held by a replica that died (a file
// created exclusively and removed by its creator would be, and removing
// one judged stale can remove the fresh one of a replica that took it
// meanwhile: two replicas taking one lock over). The holder removes the
// file before it unlocks it; a replica that locked a file removed
// meanwhile finds another, or none, at its name, and tries again. On a
// file system without flock the file it created exclusively is its hold,
// and one it found is judged as holdTakeoverExclusive judges it.
//
// Both ways meet on one file (a replica whose file system refuses flock,
// or a rolling upgrade from a version without it), so the flock holder
// writes one byte into the file it holds: its time is fresh to a replica
// judging the file by its time, which then leaves it, and a file found
// empty and fresh, flocked or not, is one created exclusively and held.
// What flock cannot close is the exclusive way's own window: a file left
// by a replica that died, found stale by both ways at once, can be taken
// by both (the replica without flock removes it by name after looking at
// its time), as by two replicas without flock.
// It reports false when another replica holds it.
func holdTakeover(marker string) (release func(), ok bool, err error) {
	for range 8 {
		created := true
		f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
		if errors.Is(err, fs.ErrExist) {
			created = false
			if f, err = os.OpenFile(marker, os.O_RDWR, 0); errors.Is(err, fs.ErrNotExist) {
				continue // removed by its holder meanwhile
			}
		}
		if err != nil {
			return nil, false, err
		}
		if !created {
			// Created exclusively and not written: held by a replica
			// without flock (or by the previous version's exclusive way,
			// during a rolling upgrade), or by one between its create and
			// its flock, which it would fail if this one flocked it now.
			if info, err := f.Stat(); err == nil && info.Size() == 0 && time.Since(info.ModTime()) <= lockStale {
				_ = f.Close()
				return nil, false, nil
			}
		}
		err = flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		for try := 0; errors.Is(err, syscall.EINTR) && try < 3; try++ {
			err = flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		}
		if err != nil {
			switch {
			case errors.Is(err, syscall.EWOULDBLOCK):
				// Held by another (one that found the file this one
				// created, in a version that flocked every file it found,
				// removes it when done).
				_ = f.Close()
				return nil, false, nil
			case errors.Is(err, syscall.ENOLCK) || errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS):
				// A file system without flock (some network and FUSE ones).
				_ = f.Close()
				if created {
					return func() { _ = os.Remove(marker) }, true, nil
				}
				return holdTakeoverExclusive(marker)
			}
			if created && atName(f, marker) {
				_ = os.Remove(marker) // left, it would be held for 10 s by no one
			}
			_ = f.Close()
			return nil, false, err
		}
		if !atName(f, marker) {
			_ = f.Close()
			continue // removed by its holder meanwhile
		}
		release := func() {
			_ = os.Remove(marker)
			_ = f.Close() // unlocks
		}
		// Written, the file is fresh to a replica judging it by its time
		// (exclusive creation), and not empty to one that flocks it.
		if _, err := f.WriteAt([]byte("f"), 0); err != nil {
			release()
			return nil, false, err
		}
		return release, true, nil
	}
	return nil, false, nil // it changed hands eight times: held by others
}

// atName reports whether the file at name is still f.
func atName(f *os.File, name string) bool {
	held, err1 := f.Stat()
	named, err2 := os.Stat(name)
	return err1 == nil && err2 == nil && os.SameFile(held, named)
}
