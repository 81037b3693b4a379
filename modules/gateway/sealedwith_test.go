package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// storedThen is storage that runs then once, right after the first Store
// of key: another replica's write landing between this one's Store and
// what it does next.
type storedThen struct {
	certmagic.Storage
	key  string
	then func()
}

func (s *storedThen) Store(ctx context.Context, key string, value []byte) error {
	err := s.Storage.Store(ctx, key, value)
	if key == s.key && s.then != nil {
		then := s.then
		s.then = nil
		then()
	}
	return err
}

// Regression: a save on a replica still on the replaced key undoes what it
// stored once it finds the new canary sealed meanwhile (see
// checkKeyAfterSealing). If the person connected again on a replica with
// the new key in that instant, the record there is theirs, newer: it
// used to be deleted with it, and they had to connect once more.
func TestSaveUndoneLeavesANewerRecordOfAnotherReplica(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	k1 := &r9Gated{key: testCipher(t), entered: make(chan struct{}), release: make(chan struct{})}
	k2 := testCipher(t)
	const user = "alice"
	key := ConnectionKey("personal", user)

	// Replica A starts with K1 and alice connects.
	hooked := &storedThen{Storage: storage, key: key}
	replicaA := r7App(t, storage, k1, user)
	replicaA.connections = newConnectionStore(hooked, k1, 0)
	if err := replicaA.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	if err := replicaA.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-1"}); err != nil {
		t.Fatal(err)
	}
	r8Age(t, dir, cipherCanaryKey, 48*time.Hour)
	r8Age(t, dir, key, 24*time.Hour)

	// The operator's reset; A refreshes alice's grant, its Encrypt in flight.
	if err := storage.Store(ctx, cipherCanaryKey, []byte("reset\n")); err != nil {
		t.Fatal(err)
	}
	k1.gate.Store(true)
	saved := make(chan error, 1)
	go func() {
		saved <- replicaA.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-2", RefreshToken: "r"})
	}()
	<-k1.entered
	k1.gate.Store(false)

	// Meanwhile replica B restarts with K2 and seals the new canary; and
	// right after A stored its record, alice connects again on B.
	replicaB := r7App(t, storage, k2, user)
	replicaB.connections = newConnectionStore(storage, k2, 0)
	if err := replicaB.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	hooked.then = func() {
		if err := replicaB.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-B"}); err != nil {
			t.Errorf("alice connecting again on replica B: %v", err)
		}
	}
	close(k1.release)
	if err := <-saved; err == nil {
		t.Fatal("a save sealed with the replaced key, after the new canary, succeeded")
	}

	conn, err := replicaB.connections.LoadFresh(ctx, "personal", user)
	if err != nil || conn.AccessToken != "tok-B" {
		t.Fatalf("alice's connection made again on replica B, after replica A's save of the replaced key was undone: %+v, %v; want tok-B", conn, err)
	}
}
