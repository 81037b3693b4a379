package gateway

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync"
	"testing"

	"github.com/caddyserver/certmagic"
)

// Holds: with the file_system storage, a listing taken while values are
// written into the listed directory names only keys that load, and never
// fails: before it, the listing named the writes' temporary files (a reader
// deleting what it could not read made the write fail) or failed with "no
// such file or directory" (read as an empty listing).
func TestFileSystemListingsHoldWhileValuesAreWritten(t *testing.T) {
	storage := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	ctx := context.Background()
	if err := storage.Store(ctx, "dir/seed", []byte("v")); err != nil {
		t.Fatal(err)
	}
	const writes = 400
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		defer close(stop)
		for i := range writes {
			if err := storage.Store(ctx, fmt.Sprintf("dir/key-%d", i%20), []byte("v")); err != nil {
				t.Errorf("write %d: %v", i, err)
				return
			}
		}
	})
	var bad []string
	listings := 0
	for done := false; !done; listings++ {
		select {
		case <-stop:
			done = true
		default:
		}
		keys, err := storage.List(ctx, "dir", false)
		if err != nil {
			bad = append(bad, "listing: "+err.Error())
			continue
		}
		for _, key := range keys {
			if data, err := storage.Load(ctx, key); err != nil || string(data) != "v" {
				bad = append(bad, fmt.Sprintf("%s: %q %v", key, data, err))
			}
		}
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Errorf("%d listings alongside %d writes; %d listed keys did not load or listings failed, such as %q", listings, writes, len(bad), bad[:min(5, len(bad))])
	}
}

// Holds: the file_system storage's listings are FileStorage's, but for the
// writes in flight: children with directories, or every key depth first,
// a missing prefix an fs.ErrNotExist and a value's prefix no keys.
func TestFileSystemListingsAreFileStorages(t *testing.T) {
	plain := &certmagic.FileStorage{Path: t.TempDir()}
	storage := SafeListing(plain)
	ctx := context.Background()
	for _, key := range []string{"a/b/c", "a/b/d", "a/e", "a/1/f", "g"} {
		if err := storage.Store(ctx, key, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		prefix    string
		recursive bool
	}{{"a", false}, {"a", true}, {"", true}, {"a/b", false}, {"g", false}} {
		want, werr := plain.List(ctx, c.prefix, c.recursive)
		got, err := storage.List(ctx, c.prefix, c.recursive)
		if !slices.Equal(got, want) || (err == nil) != (werr == nil) {
			t.Errorf("List(%q, %v) = %q %v, FileStorage's %q %v", c.prefix, c.recursive, got, err, want, werr)
		}
	}
	if _, err := storage.List(ctx, "none", false); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("listing a prefix that does not exist: %v, want fs.ErrNotExist", err)
	}
}
