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
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/modules/storage/postgres"
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

// gatedReplicas is two replicas' connection stores on one directory, a
// reading through a gateStorage.
func gatedReplicas(t *testing.T) (gs *gateStorage, a, other *ConnectionStore) {
	t.Helper()
	setClock(t, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	fs, _ := fileStorage(t)
	gs = &gateStorage{Storage: fs}
	c := testCipher(t)
	return gs, newConnectionStore(gs, c, time.Hour), newConnectionStore(fs, c, time.Hour)
}

func TestLoadFreshForgetRacingSaveLosesNothing(t *testing.T) {
	ctx := context.Background()
	gs, a, other := gatedReplicas(t)
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
	gs, a, other := gatedReplicas(t)
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

// announcingStorage is a storage that announces changes, whose
// announcements the test makes (notify).
type announcingStorage struct {
	certmagic.Storage
	mu sync.Mutex
	fn func(postgres.Change)
}

func (s *announcingStorage) Publish(context.Context, string) error { return nil }

func (s *announcingStorage) Subscribe(_ string, fn func(postgres.Change)) (func(), error) {
	s.mu.Lock()
	s.fn = fn
	s.mu.Unlock()
	return func() {}, nil
}

func (s *announcingStorage) notify(c postgres.Change) {
	s.mu.Lock()
	fn := s.fn
	s.mu.Unlock()
	fn(c)
}

// What holds a caller's credential itself (OnConnectionGone) hears of a
// connection deleted here at once, of one changed on another replica when
// it is announced, and of "anything may be gone" ("") when the listening
// connection was lost (announcements missed meanwhile); never of its own
// replica's echo twice.
func TestConnectionGoneHooks(t *testing.T) {
	ctx := context.Background()
	fs, _ := fileStorage(t)
	st := &announcingStorage{Storage: fs}
	s := newConnectionStore(st, testCipher(t), time.Hour)
	var got []string
	s.onGone(func(key string) { got = append(got, key) })
	if err := s.start(nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	if err := s.Save(ctx, "svc", "alice", &Connection{Kind: AuthBearer, AccessToken: "one", ConnectedAt: time.Unix(1, 0)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "svc", "alice"); err != nil {
		t.Fatal(err)
	}
	alice, bob := ConnectionKey("svc", "alice"), ConnectionKey("svc", "bob")
	st.notify(postgres.Change{Key: alice, Local: true}) // this replica's own announcement, back
	st.notify(postgres.Change{Key: bob})                // another replica's
	st.notify(postgres.Change{Reset: true})             // listening again after a loss
	if want := []string{alice, bob, ""}; !slices.Equal(got, want) {
		t.Errorf("the hooks heard %q, want %q", got, want)
	}
}
