// Package storecache keeps what toolgate reads from Caddy storage in memory
// for as long as it is unchanged, so that a replica's steady state makes no
// storage round trip, and forgets it the moment another replica changes it.
//
// # Why notifications and not a short TTL
//
// Replicas share one storage. A read-through cache that trusts an entry
// for a fixed time costs one read per entry, per replica, per TTL, whether
// anything changed or not: 100,000 sessions used through 20 replicas with a
// 10 s TTL is 100,000 × 20 / 10 s = 200,000 reads a second, all of them
// answering "unchanged". Storages that can tell every process of a change
// (caddy.storage.postgres, with PostgreSQL's LISTEN/NOTIFY) let a cache keep
// an entry until the key changes: a writer stores, then announces the key
// (Watch.Changed); every process drops its copy and reads the new value
// when it next needs it. Reads then follow changes, not time.
//
// # What may be stale, and for how long
//
// A change is seen by another process as soon as its notification arrives
// (PostgreSQL delivers it right after the announcing statement; typically
// well under a millisecond on a LAN). A Watch is live once its subscription
// listens (its first Reset). When the listening connection is lost,
// notifications sent meanwhile are lost too: the storage says so (a Reset
// marked Lost), every copy is dropped, and until the connection is back
// (its Reset drops everything again) copies are trusted for the TTL only.
// A process whose connection dies silently notices within the storage's
// liveness check (30 s for caddy.storage.postgres), so that is the
// longest a copy can outlive a change. Before the first Reset, while the
// connection is lost, and with storages that offer no notifications
// (file_system, Redis, S3 plugins), entries are trusted for the TTL given
// instead: cache_ttl, a change made through another replica showing
// within it.
//
// # Storages with notifications
//
// A storage offers notifications by implementing [Notifier] (Publish and
// Subscribe, with the postgres storage's Change). An announcement that
// fails (the database went away between the write and the announcement)
// is retried in the background until it is made, so no replica keeps a
// copy of a value that changed.
package storecache

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/storage/postgres"
)

// Notifier is a storage that tells every process using it when a key
// changed: caddy.storage.postgres.
type Notifier interface {
	Publish(ctx context.Context, key string) error
	Subscribe(prefix string, fn func(postgres.Change)) (unsubscribe func(), err error)
}

// A Change is one key announced as changed, or a Reset: anything under the
// watched prefix may have changed.
type Change struct {
	Key   string
	Reset bool
	// Local reports that this process announced it.
	Local bool
}

// Watch follows the changes of the keys under one prefix of a storage.
type Watch struct {
	storage  certmagic.Storage
	notifier Notifier
	prefix   string
	logger   *zap.Logger

	live     atomic.Bool
	mu       sync.Mutex
	handlers []func(Change)
	echoes   map[string][]chan struct{}
	unsub    func()
	retry    map[string]struct{} // announcements to make again
	retrying bool
	stopped  chan struct{}
}

// NewWatch prepares a watch of the keys under prefix; Start starts it.
func NewWatch(storage certmagic.Storage, prefix string) *Watch {
	w := &Watch{storage: storage, prefix: prefix, logger: zap.NewNop(),
		echoes: make(map[string][]chan struct{}), retry: make(map[string]struct{}), stopped: make(chan struct{})}
	w.notifier, _ = storage.(Notifier)
	return w
}

// Notifies reports whether the storage tells of changes at all.
func (w *Watch) Notifies() bool { return w.notifier != nil }

// Live reports whether changes are being received: the subscription
// listens (it had its first Reset) and was not stopped.
func (w *Watch) Live() bool { return w.live.Load() }

// OnChange adds fn, called for every change under the prefix, on the
// storage's listener goroutine: fn must return quickly. Call it before
// Start.
func (w *Watch) OnChange(fn func(Change)) {
	w.mu.Lock()
	w.handlers = append(w.handlers, fn)
	w.mu.Unlock()
}

// Start subscribes; failed announcements are logged to logger (nil: not
// logged). It does not wait for the storage: the watch becomes live when
// the subscription listens. Without notifications it does nothing.
func (w *Watch) Start(logger *zap.Logger) error {
	if logger != nil {
		w.mu.Lock()
		w.logger = logger
		w.mu.Unlock()
	}
	if w.notifier == nil {
		return nil
	}
	unsub, err := w.notifier.Subscribe(w.prefix, w.dispatch)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.unsub = unsub
	w.mu.Unlock()
	return nil
}

// Follow starts following the storage's announcements until done is
// closed. An error says it cannot: copies are then trusted for the cache
// TTL.
func (w *Watch) Follow(done <-chan struct{}, logger *zap.Logger) error {
	if err := w.Start(logger); err != nil {
		return err
	}
	go func() {
		<-done
		w.Stop()
	}()
	return nil
}

// Stop unsubscribes; the watch is no longer live. Announcements still
// being retried are given up.
func (w *Watch) Stop() {
	w.mu.Lock()
	unsub := w.unsub
	w.unsub = nil
	select {
	case <-w.stopped:
	default:
		close(w.stopped)
	}
	w.mu.Unlock()
	w.live.Store(false)
	if unsub != nil {
		unsub()
	}
}

func (w *Watch) dispatch(c postgres.Change) {
	change := Change{Key: c.Key, Reset: c.Reset, Local: c.Local}
	if c.Reset {
		w.live.Store(!c.Lost)
	}
	w.mu.Lock()
	handlers := w.handlers
	var echoes []chan struct{}
	if c.Local && !c.Reset {
		echoes = w.echoes[c.Key]
		delete(w.echoes, c.Key)
	}
	w.mu.Unlock()
	for _, fn := range handlers {
		fn(change)
	}
	for _, e := range echoes {
		close(e)
	}
}

// Changed announces that key (under the prefix) was written or deleted, to
// every process using the storage. Call it after the write. An
// announcement that fails is retried in the background until it is made
// (or the watch stops); Changed reports no error for it.
func (w *Watch) Changed(ctx context.Context, key string) {
	if w.notifier == nil {
		return
	}
	if err := w.notifier.Publish(ctx, key); err != nil {
		w.retryLater(key, err)
	}
}

// ChangedAndWait is Changed, then waits, at most max, until this process
// received its own announcement back: by then the storage has sent it to
// every listening process. It reports whether the echo arrived.
func (w *Watch) ChangedAndWait(ctx context.Context, key string, max time.Duration) bool {
	if w.notifier == nil || !w.Live() {
		w.Changed(ctx, key)
		return false
	}
	echo := make(chan struct{})
	w.mu.Lock()
	w.echoes[key] = append(w.echoes[key], echo)
	w.mu.Unlock()
	if err := w.notifier.Publish(ctx, key); err != nil {
		w.retryLater(key, err)
		return false
	}
	t := time.NewTimer(max)
	defer t.Stop()
	select {
	case <-echo:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// retryLater keeps key to announce again, once a second, until that works.
func (w *Watch) retryLater(key string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.logger.Warn("announcing a storage change failed; retrying in the background",
		zap.String("key", key), zap.Error(err))
	w.retry[key] = struct{}{}
	if w.retrying {
		return
	}
	w.retrying = true
	go w.retryLoop()
}

func (w *Watch) retryLoop() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-w.stopped:
			w.mu.Lock()
			w.retrying = false
			w.mu.Unlock()
			return
		case <-t.C:
		}
		w.mu.Lock()
		keys := make([]string, 0, len(w.retry))
		for k := range w.retry {
			keys = append(keys, k)
		}
		w.mu.Unlock()
		for _, k := range keys {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := w.notifier.Publish(ctx, k)
			cancel()
			if err != nil {
				break // still unavailable: try again next tick
			}
			w.mu.Lock()
			delete(w.retry, k)
			w.mu.Unlock()
		}
		w.mu.Lock()
		if len(w.retry) == 0 {
			w.retrying = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
	}
}

// Under reports whether key is prefix or below it.
func Under(key, prefix string) bool {
	return key == prefix || strings.HasPrefix(key, prefix+"/")
}
