package gateway

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Both ways of holding a takeover file exclude a second holder until
// released, remove the file on release, and take one left behind by a
// replica that died: flock's unlocked by the kernel, the exclusive one's
// once stale (a fresh one stays another's).
func TestTakeoverFileHeldByOne(t *testing.T) {
	for name, hold := range map[string]func(string) (func(), bool, error){
		"holdTakeover": holdTakeover, "holdTakeoverExclusive": holdTakeoverExclusive,
	} {
		t.Run(name, func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "x.lock.takeover")
			release, ok, err := hold(marker)
			if !ok || err != nil {
				t.Fatalf("a free takeover file: %v, %v", ok, err)
			}
			if _, ok, err := hold(marker); ok || err != nil {
				t.Fatalf("a held takeover file taken again: %v, %v", ok, err)
			}
			release()
			if _, err := os.Stat(marker); !os.IsNotExist(err) {
				t.Fatalf("released, the takeover file stays: %v", err)
			}

			// Left behind by a replica that died.
			if err := os.WriteFile(marker, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			old := time.Now().Add(-2 * lockStale)
			if err := os.Chtimes(marker, old, old); err != nil {
				t.Fatal(err)
			}
			release, ok, err = hold(marker)
			if !ok || err != nil {
				t.Fatalf("a takeover file left by a dead replica: %v, %v", ok, err)
			}
			release()
		})
	}
	// Exclusively created and fresh: another replica's, whether or not it
	// still runs.
	marker := filepath.Join(t.TempDir(), "y.lock.takeover")
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := holdTakeoverExclusive(marker); ok || err != nil {
		t.Errorf("a fresh takeover file taken: %v, %v", ok, err)
	}
}
