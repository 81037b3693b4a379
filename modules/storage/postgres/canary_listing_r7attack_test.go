package postgres

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// HELD (change B, 1a79dc9): the listing the cipher check at start makes
// (List("toolgate/connections", recursive), modules/gateway/canary.go
// checkConnection) is the same on a real PostgreSQL as on file_system: the
// rejected marks under the similarly named toolgate/connections-rejected/,
// a value named like the directory plus a suffix, and another prefix are
// not listed; the connection records and their service directories are,
// in the same order; a storage without connections is fs.ErrNotExist on
// both, which the check takes as nothing to check.
func TestR7CanaryConnectionListingMatchesFileSystem(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pg := newStorage(t, sharedDSN(t, "r7canary"), newTableName(), DefaultLockLease)
	fsys := &certmagic.FileStorage{Path: t.TempDir()}
	const h = "2bd806c97f0e00af1a1fc3328fa763a9269723c8db8fac4f93af71db186d6e90"

	for name, s := range map[string]certmagic.Storage{"postgres": pg, "file_system": fsys} {
		if _, err := s.List(ctx, "toolgate/connections", true); err == nil {
			t.Errorf("%s: listing connections of an empty storage: no error; want fs.ErrNotExist", name)
		}
	}
	keys := []string{
		"toolgate/connections/personal/" + h,
		"toolgate/connections/other/" + h,
		"toolgate/connections-rejected/personal/" + h,
		"toolgate/connectionsX",
		"toolgate/connections.bak/personal/" + h,
		"toolgate/cipher-canary",
	}
	for _, k := range keys {
		for name, s := range map[string]certmagic.Storage{"postgres": pg, "file_system": fsys} {
			if err := s.Store(ctx, k, []byte("v")); err != nil {
				t.Fatalf("%s: storing %s: %v", name, k, err)
			}
		}
	}
	got, err := pg.List(ctx, "toolgate/connections", true)
	if err != nil {
		t.Fatal(err)
	}
	want, err := fsys.List(ctx, "toolgate/connections", true)
	if err != nil {
		t.Fatal(err)
	}
	// FileStorage lists keys with the OS separator and in walk order.
	if !slices.Equal(got, want) {
		t.Errorf("postgres lists %q; file_system %q", got, want)
	}
	for _, k := range got {
		if !strings.HasPrefix(k, "toolgate/connections/") {
			t.Errorf("postgres lists %q under toolgate/connections", k)
		}
	}
}
