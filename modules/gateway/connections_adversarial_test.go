package gateway

// Attacks on ConnectionStore.LoadFresh forgetting the cached connection
// when storage has none (commit 7f325d3), racing writes on the same
// replica and reads of another.
//
// Attack: a fresh read finds no connection (alice disconnected through
// another replica); before it forgets the cached entry, alice connects a
// new account through this replica (Save puts it in the cache). Is the new
// connection lost (Forget drops it)?
// Holds: Forget only drops the cached copy; the next Load reads storage
// and finds the new connection (nothing lost, nothing stale served).
// (TestLoadFreshForgetRacingSaveLosesNothing)
//
// Attack: a plain Load (cache miss) reads the connection from storage just
// before alice disconnects through another replica, and stores what it
// read after a fresh read on this replica found none and forgot: is the
// deleted connection resurrected in the cache (served until cache_ttl)?
// Holds: Forget bumps the key's stripe; the slower load does not keep
// what it read. (TestLoadFreshForgetBeatsSlowLoadOfDeletedConnection)

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// gateStorage holds the next Load of key after it read storage, until
// released.
type gateStorage struct {
	certmagic.Storage
	mu      sync.Mutex
	key     string
	read    chan struct{}
	release chan struct{}
}

func (s *gateStorage) arm(key string) (read <-chan struct{}, release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key, s.read, s.release = key, make(chan struct{}), make(chan struct{})
	rel := s.release
	var once sync.Once
	return s.read, func() { once.Do(func() { close(rel) }) }
}

func (s *gateStorage) Load(ctx context.Context, key string) ([]byte, error) {
	data, err := s.Storage.Load(ctx, key)
	s.mu.Lock()
	armed := s.key != "" && key == s.key
	read, release := s.read, s.release
	if armed {
		s.key = ""
	}
	s.mu.Unlock()
	if armed {
		close(read)
		<-release
	}
	return data, err
}

func TestLoadFreshForgetRacingSaveLosesNothing(t *testing.T) {
	ctx := context.Background()
	setClock(t, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	fs, _ := fileStorage(t)
	gs := &gateStorage{Storage: fs}
	c := testCipher(t)
	a := newConnectionStore(gs, c, time.Hour)
	other := newConnectionStore(fs, c, time.Hour) // another replica, same directory
	if err := a.Save(ctx, "svc", "alice", &Connection{Kind: AuthBearer, AccessToken: "one", ConnectedAt: time.Unix(1, 0)}); err != nil {
		t.Fatal(err)
	}
	if err := other.Delete(ctx, "svc", "alice"); err != nil {
		t.Fatal(err)
	}
	read, release := gs.arm(ConnectionKey("svc", "alice"))
	done := make(chan error, 1)
	go func() {
		_, err := a.LoadFresh(ctx, "svc", "alice")
		done <- err
	}()
	<-read // the fresh read found nothing
	if err := a.Save(ctx, "svc", "alice", &Connection{Kind: AuthBearer, AccessToken: "two", ConnectedAt: time.Unix(2, 0)}); err != nil {
		t.Fatal(err)
	}
	release()
	if err := <-done; !errors.Is(err, ErrNotConnected) {
		t.Fatalf("LoadFresh = %v, want ErrNotConnected", err)
	}
	got, err := a.Load(ctx, "svc", "alice")
	if err != nil || got.AccessToken != "two" {
		t.Errorf("after a fresh read of nothing raced a new connection on the same replica: Load = %v, %v; want the new connection", got, err)
	}
}

func TestLoadFreshForgetBeatsSlowLoadOfDeletedConnection(t *testing.T) {
	ctx := context.Background()
	setClock(t, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	fs, _ := fileStorage(t)
	gs := &gateStorage{Storage: fs}
	c := testCipher(t)
	a := newConnectionStore(gs, c, time.Hour)
	other := newConnectionStore(fs, c, time.Hour)
	if err := other.Save(ctx, "svc", "alice", &Connection{Kind: AuthBearer, AccessToken: "one", ConnectedAt: time.Unix(1, 0)}); err != nil {
		t.Fatal(err)
	}
	read, release := gs.arm(ConnectionKey("svc", "alice"))
	slow := make(chan error, 1)
	go func() {
		_, err := a.Load(ctx, "svc", "alice") // a cache miss: reads "one"
		slow <- err
	}()
	<-read
	if err := other.Delete(ctx, "svc", "alice"); err != nil { // disconnected through another replica
		t.Fatal(err)
	}
	if _, err := a.LoadFresh(ctx, "svc", "alice"); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("LoadFresh after the disconnect = %v, want ErrNotConnected", err)
	}
	release()
	if err := <-slow; err != nil {
		t.Fatalf("the slow load: %v", err)
	}
	if got, err := a.Load(ctx, "svc", "alice"); !errors.Is(err, ErrNotConnected) {
		t.Errorf("a load that read the connection before the disconnect finished after a fresh read found none: "+
			"Load now = %v, %v; want ErrNotConnected (the deleted token must not come back into the cache)", got, err)
	}
}
