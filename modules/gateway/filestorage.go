package gateway

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/caddyserver/certmagic"
)

// fileSystemStorage is the file_system storage with listings that other
// writers cannot break. certmagic's FileStorage writes a value to a
// temporary file in its key's directory (named by os.CreateTemp: decimal
// digits) and renames it into place, and lists with filepath.Walk. So a
// listing taken meanwhile
//   - named the temporary file as a key: a reader that found it unreadable
//     (no approval of that id, no session in it) deleted it as litter, and
//     the write failed ("failed to rename": a call that needed an approval
//     was refused with "approvals cannot be read or stored");
//   - or failed whole with "no such file or directory" when the rename
//     took the temporary file away between reading the directory and its
//     Lstat, which callers read as an empty listing (as they should for a
//     prefix that does not exist): an approval of the identical call was
//     not found, a person's pending approvals were counted as none.
//
// Its List reads the directories itself: a regular file named only by
// digits is a write in flight and is left out (no toolgate value is named
// so: values are named by ids, hashes and names; mcpstate's windows are
// digits, but directories), and so is an entry gone meanwhile.
//
// Its locks are its own too (see filelock.go).
type fileSystemStorage struct {
	*certmagic.FileStorage
	locks fileLocks
}

// List returns the keys under prefix as FileStorage does (the children,
// directories included, or with recursive every key below, in a
// depth-first walk, names sorted), without the writes in flight.
func (s *fileSystemStorage) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	root := s.Filename(prefix)
	info, err := os.Stat(root)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return nil, nil
	}
	var keys []string
	var walk func(dir, key string) error
	walk = func(dir, key string) error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := ctx.Err(); err != nil {
				return err
			}
			if e.Type().IsRegular() && inFlightName(e.Name()) {
				continue
			}
			k := path.Join(key, e.Name())
			keys = append(keys, k)
			if !recursive || !e.IsDir() {
				continue
			}
			if err := walk(filepath.Join(dir, e.Name()), k); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
		return nil
	}
	if err := walk(root, prefix); err != nil {
		return nil, err
	}
	return keys, nil
}

// inFlightName reports whether name is one os.CreateTemp(dir, "") gives:
// decimal digits only.
func inFlightName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if name[i] < '0' || name[i] > '9' {
			return false
		}
	}
	return true
}

// SafeListing returns storage with listings that writes in flight cannot
// break (fileSystemStorage) when it is the file_system storage, and
// storage itself otherwise. The App's storage always goes through it; a
// test of a store over the file_system storage uses it to see what the
// App's stores see.
func SafeListing(storage certmagic.Storage) certmagic.Storage {
	if fsys, ok := storage.(*certmagic.FileStorage); ok {
		return &fileSystemStorage{FileStorage: fsys, locks: fileLocks{held: map[string]*heldLock{}}}
	}
	return storage
}

// checkWritable makes the storage's directory if it is missing, and checks
// that a file can be written in it: a path that is a file, or a directory
// toolgate may not write, fails every request that stores anything, each
// answered "try again", so the start is refused instead, saying why.
func (s *fileSystemStorage) checkWritable() error {
	if err := os.MkdirAll(s.Path, 0o700); err != nil {
		return fmt.Errorf("storage file_system %s: %w: give a directory toolgate may write", s.Path, err)
	}
	f, err := os.CreateTemp(s.Path, ".toolgate-probe-*")
	if err != nil {
		return fmt.Errorf("storage file_system %s: %w: give a directory toolgate may write", s.Path, err)
	}
	f.Close()
	return os.Remove(f.Name())
}
