package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// The storages and ciphers the tests of saves sealed with the cipher
// (sealedwith*_test.go) inject their faults and races with, and the
// rolling reset they start from.

// hookStore is storage with faults and hooks, each on one key: the next n
// Loads, Stats, Stores or Deletes of a key fail as a storage backend's
// passing fault does (a failed Store or Delete changes nothing); a hook
// runs once, right after the next Store of its key (afterStore), right
// after a Load of its key read its value (afterLoad: the first after skip
// others), or right after a Stat of its key (afterStat).
type hookStore struct {
	certmagic.Storage
	mu          sync.Mutex
	loadFails   map[string]int
	statFails   map[string]int
	storeFails  map[string]int
	deleteFails map[string]int
	storeKey    string
	onStore     func()
	loadKey     string
	loadSkip    int
	onLoad      func()
	statKey     string
	onStat      func()
}

func (s *hookStore) setFails(m *map[string]int, key string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *m == nil {
		*m = map[string]int{}
	}
	(*m)[key] = n
}

// failLoads makes the next n Loads of key fail; failStats, failStores
// and failDeletes the same for Stats, Stores and Deletes.
func (s *hookStore) failLoads(key string, n int)   { s.setFails(&s.loadFails, key, n) }
func (s *hookStore) failStats(key string, n int)   { s.setFails(&s.statFails, key, n) }
func (s *hookStore) failStores(key string, n int)  { s.setFails(&s.storeFails, key, n) }
func (s *hookStore) failDeletes(key string, n int) { s.setFails(&s.deleteFails, key, n) }

// loadFaultsLeft is how many of the Loads of key made to fail are still
// to come; statFaultsLeft the same for Stats.
func (s *hookStore) loadFaultsLeft(key string) int { return s.faultsLeft(s.loadFails, key) }
func (s *hookStore) statFaultsLeft(key string) int { return s.faultsLeft(s.statFails, key) }

func (s *hookStore) faultsLeft(m map[string]int, key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return m[key]
}

func (s *hookStore) fails(m map[string]int, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m[key] > 0 {
		m[key]--
		return true
	}
	return false
}

func (s *hookStore) afterStore(key string, then func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.storeKey, s.onStore = key, then
}

func (s *hookStore) afterLoad(key string, skip int, then func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loadKey, s.loadSkip, s.onLoad = key, skip, then
}

func (s *hookStore) afterStat(key string, then func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.statKey, s.onStat = key, then
}

// loadPending reports whether the hook set with afterLoad is still to
// run; statPending the same for afterStat.
func (s *hookStore) loadPending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.onLoad != nil
}

func (s *hookStore) statPending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.onStat != nil
}

func (s *hookStore) Load(ctx context.Context, key string) ([]byte, error) {
	if s.fails(s.loadFails, key) {
		return nil, errors.New("test: storage backend: connection reset by peer")
	}
	v, err := s.Storage.Load(ctx, key)
	s.mu.Lock()
	var then func()
	if key == s.loadKey && s.onLoad != nil {
		if s.loadSkip > 0 {
			s.loadSkip--
		} else {
			then, s.onLoad = s.onLoad, nil
		}
	}
	s.mu.Unlock()
	if then != nil {
		then()
	}
	return v, err
}

func (s *hookStore) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	if s.fails(s.statFails, key) {
		return certmagic.KeyInfo{}, errors.New("test: storage backend: i/o timeout")
	}
	info, err := s.Storage.Stat(ctx, key)
	s.mu.Lock()
	var then func()
	if key == s.statKey && s.onStat != nil {
		then, s.onStat = s.onStat, nil
	}
	s.mu.Unlock()
	if then != nil {
		then()
	}
	return info, err
}

func (s *hookStore) Store(ctx context.Context, key string, value []byte) error {
	if s.fails(s.storeFails, key) {
		return errors.New("test: storage backend: writing " + key + ": i/o timeout")
	}
	err := s.Storage.Store(ctx, key, value)
	s.mu.Lock()
	var then func()
	if key == s.storeKey && s.onStore != nil {
		then, s.onStore = s.onStore, nil
	}
	s.mu.Unlock()
	if then != nil {
		then()
	}
	return err
}

// Delete's error names the key, as storage errors do.
func (s *hookStore) Delete(ctx context.Context, key string) error {
	if s.fails(s.deleteFails, key) {
		return errors.New("test: storage backend: deleting " + key + ": permission denied")
	}
	return s.Storage.Delete(ctx, key)
}

// valueDeleting is a hookStore with DeleteIfValue (the postgres storage's
// valueDeleter; its TestDeleteIfValue shows the one step there): a
// compare and delete under a lock, of the storage below the hooks.
type valueDeleting struct {
	*hookStore
	cas sync.Mutex
}

func (s *valueDeleting) DeleteIfValue(ctx context.Context, key string, value []byte) (bool, error) {
	s.cas.Lock()
	defer s.cas.Unlock()
	now, err := s.Storage.Load(ctx, key)
	if errors.Is(err, fs.ErrNotExist) || err == nil && !bytes.Equal(now, value) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, s.Storage.Delete(ctx, key)
}

// casStore is valueDeleting with ReplaceIfValue too (the postgres
// storage's valueReplacer): a compare and write under the same lock,
// whose write is the hookStore's Store (its fault and its hook apply).
type casStore struct {
	*valueDeleting
}

// newCAS is a casStore over h.
func newCAS(h *hookStore) *casStore {
	return &casStore{&valueDeleting{hookStore: h}}
}

func (s *casStore) ReplaceIfValue(ctx context.Context, key string, old, value []byte) (bool, error) {
	s.cas.Lock()
	defer s.cas.Unlock()
	now, err := s.Storage.Load(ctx, key)
	if errors.Is(err, fs.ErrNotExist) || err == nil && !bytes.Equal(now, old) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := s.hookStore.Store(ctx, key, value); err != nil {
		return false, err
	}
	return true, nil
}

// cipherDown is a cipher whose Decrypts all fail while down is set (Vault
// sealed or restarting, KMS throttling): it answers ErrCipherUnavailable,
// as the real ciphers do; the cipher cannot tell.
type cipherDown struct {
	Cipher
	down atomic.Bool
}

func (c *cipherDown) Decrypt(ctx context.Context, ciphertext, context []byte) ([]byte, error) {
	if c.down.Load() {
		return nil, fmt.Errorf("vault transit at https://vault.example: %w: Vault is sealed", ErrCipherUnavailable)
	}
	return c.Cipher.Decrypt(ctx, ciphertext, context)
}

// decryptBlips is a cipher whose next n Decrypts under context (the
// canary's, cipherCanaryContext, or a connection's) answer
// ErrCipherUnavailable: Vault's or KMS's passing fault (a 429, a timeout)
// landing on those round trips.
type decryptBlips struct {
	Cipher
	context []byte
	n       atomic.Int32
}

func (c *decryptBlips) Decrypt(ctx context.Context, ciphertext, context []byte) ([]byte, error) {
	if bytes.Equal(context, c.context) && c.n.Add(-1) >= 0 {
		return nil, fmt.Errorf("vault transit at https://vault.example: %w: 429 too many requests", ErrCipherUnavailable)
	}
	return c.Cipher.Decrypt(ctx, ciphertext, context)
}

// resetDuringSave is the rolling reset on a file storage up to the new
// canary: replica A (its Encrypt behind the gate k1) connected alice long
// ago (connectedBeforeReset); the operator stores "reset"; A's save of
// conn is held in its Encrypt (its check before sealing behind it);
// replica B starts with a new key and seals the new canary. It returns B
// and the channel A's save answers on.
func resetDuringSave(t *testing.T, dir string, storage certmagic.Storage, replicaA *App, k1 *r9Gated, conn *Connection) (*App, chan error) {
	t.Helper()
	ctx := context.Background()
	const user = "alice"
	connectedBeforeReset(t, dir, replicaA, user)
	if err := storage.Store(ctx, cipherCanaryKey, []byte("reset\n")); err != nil {
		t.Fatal(err)
	}
	saved := r10SaveHeld(replicaA, k1, user, conn)
	replicaB := r10Replica(t, storage, storage, testCipher(t), user)
	if err := replicaB.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	return replicaB, saved
}

// r13RollingReset is the rolling reset of the change's own scenario on a
// file storage: replica A (K1, its connection store going through
// connStorage) connected alice long ago; the operator stores "reset"; A's
// save of sealed (tok-2) is held in its Encrypt; replica B (K2) starts,
// seals the new canary and records the reset (dated an hour back: B has
// been serving for a while); alice connects again on B (tok-B). It returns
// A, B, the channel A's save answers on, and the gate to release it.
func r13RollingReset(t *testing.T, dir string, storage, connStorage certmagic.Storage, wrap func(Cipher) Cipher, conn *Connection) (*App, *App, chan error, *r9Gated) {
	t.Helper()
	const user = "alice"
	k1 := r10Gate(testCipher(t))
	var c Cipher = k1
	if wrap != nil {
		c = wrap(k1)
	}
	replicaA := r10Replica(t, storage, connStorage, c, user)
	replicaB, saved := resetDuringSave(t, dir, storage, replicaA, k1, conn)
	r8Age(t, dir, cipherResetKey, time.Hour)
	if err := replicaB.connections.Save(context.Background(), "personal", user, &Connection{AccessToken: "tok-B", RefreshToken: "refresh-B"}); err != nil {
		t.Fatalf("alice connecting again on replica B: %v", err)
	}
	return replicaA, replicaB, saved, k1
}
