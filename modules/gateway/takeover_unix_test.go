//go:build unix

package gateway

import (
	"path/filepath"
	"syscall"
	"testing"
)

// On a file system without flock, a replica holds the takeover file it
// created, and a second one finds it held; released, it is taken again.
func TestTakeoverFileWithoutFlock(t *testing.T) {
	defer func(f func(int, int) error) { flock = f }(flock)
	flock = func(int, int) error { return syscall.ENOLCK }
	marker := filepath.Join(t.TempDir(), "x.lock.takeover")
	release, ok, err := holdTakeover(marker)
	if !ok || err != nil {
		t.Fatalf("a free takeover file without flock: %v, %v", ok, err)
	}
	if _, ok, err := holdTakeover(marker); ok || err != nil {
		t.Fatalf("a held takeover file taken again without flock: %v, %v", ok, err)
	}
	release()
	release, ok, err = holdTakeover(marker)
	if !ok || err != nil {
		t.Fatalf("a released takeover file without flock: %v, %v", ok, err)
	}
	release()
}
