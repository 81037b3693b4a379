package storecache

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"time"
)

// ErrUnavailable reports that the storage could not be read or written;
// retrying later may succeed. Errors of toolgate's stores wrap it.
var ErrUnavailable = errors.New("storage unavailable")

// Cache is a read-through cache of values derived from storage keys under
// a Watch's prefix (a decoded session, a decrypted grant). With a live
// watch an entry stays until its key changes; otherwise for the TTL. It is
// safe for concurrent use.
type Cache[V any] struct {
	watch *Watch
	ttl   time.Duration
	now   func() time.Time
	max   int

	mu      sync.Mutex
	entries map[string]entry[V]
	// Loads started before an invalidation of their key must not store
	// what they read: each key maps to a stripe whose counter every
	// invalidation of a key of that stripe increments; epoch counts
	// resets.
	stripes [64]uint64
	epoch   uint64
	// own counts this process's announcements whose echo has not come
	// back: the echo must not drop the value the writer just put.
	own  map[string]int
	seed maphash.Seed
}

type entry[V any] struct {
	v        V
	loadedAt time.Time
}

// DefaultMax bounds a cache's entries.
const DefaultMax = 100_000

// NewCache returns a cache following w. ttl is how long an entry is
// trusted while w is not live; now is the clock.
func NewCache[V any](w *Watch, ttl time.Duration, now func() time.Time) *Cache[V] {
	c := &Cache[V]{watch: w, ttl: ttl, now: now, max: DefaultMax, entries: make(map[string]entry[V]),
		own: make(map[string]int), seed: maphash.MakeSeed()}
	w.OnChange(c.changed)
	return c
}

func (c *Cache[V]) stripe(key string) *uint64 {
	return &c.stripes[maphash.String(c.seed, key)%uint64(len(c.stripes))]
}

func (c *Cache[V]) changed(ch Change) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch.Reset || ch.Key == "" {
		clear(c.entries)
		clear(c.own)
		c.epoch++
		return
	}
	if ch.Local && c.own[ch.Key] > 0 {
		if c.own[ch.Key]--; c.own[ch.Key] == 0 {
			delete(c.own, ch.Key)
		}
		return
	}
	delete(c.entries, ch.Key)
	*c.stripe(ch.Key)++
}

// Get returns the entry for key if it is fresh.
func (c *Cache[V]) Get(key string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		var zero V
		return zero, false
	}
	if !c.watch.Live() && c.now().Sub(e.loadedAt) >= c.ttl {
		delete(c.entries, key)
		var zero V
		return zero, false
	}
	return e.v, true
}

// Load returns the fresh entry for key, or calls load and keeps what it
// returns — unless key changed while load ran. Errors are not kept; keep
// reports whether a value load returned should be (false: absence, which
// is never cached, so that a value created elsewhere is seen at once).
func (c *Cache[V]) Load(ctx context.Context, key string, load func(context.Context) (v V, keep bool, err error)) (V, error) {
	if v, ok := c.Get(key); ok {
		return v, nil
	}
	return c.Reload(ctx, key, load)
}

// Reload is Load without looking at the entry: it always calls load.
func (c *Cache[V]) Reload(ctx context.Context, key string, load func(context.Context) (v V, keep bool, err error)) (V, error) {
	c.mu.Lock()
	stripe, epoch := *c.stripe(key), c.epoch
	c.mu.Unlock()
	v, keep, err := load(ctx)
	if err != nil || !keep {
		return v, err
	}
	c.mu.Lock()
	if *c.stripe(key) == stripe && c.epoch == epoch {
		c.putLocked(key, v)
	}
	c.mu.Unlock()
	return v, nil
}

func (c *Cache[V]) putLocked(key string, v V) {
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.max {
		for k := range c.entries { // an arbitrary one
			delete(c.entries, k)
			break
		}
	}
	c.entries[key] = entry[V]{v: v, loadedAt: c.now()}
}

// Put keeps v for key, here only: a value this process just created,
// which no other process can have a copy of.
func (c *Cache[V]) Put(key string, v V) {
	c.mu.Lock()
	*c.stripe(key)++
	c.putLocked(key, v)
	c.mu.Unlock()
}

// Forget drops key here only.
func (c *Cache[V]) Forget(key string) {
	c.mu.Lock()
	delete(c.entries, key)
	*c.stripe(key)++
	c.mu.Unlock()
}

// Wrote records that this process stored v at key, and announces the
// change to the other processes. Call it after the write.
func (c *Cache[V]) Wrote(ctx context.Context, key string, v V) {
	c.wrote(ctx, key, &v)
}

// Deleted records that this process deleted key, and announces the change
// to the other processes. Call it after the delete.
func (c *Cache[V]) Deleted(ctx context.Context, key string) {
	c.wrote(ctx, key, nil)
}

func (c *Cache[V]) wrote(ctx context.Context, key string, v *V) {
	c.mu.Lock()
	*c.stripe(key)++ // a load in flight read the old value
	if v != nil {
		c.putLocked(key, *v)
	} else {
		delete(c.entries, key)
	}
	if c.watch.Notifies() {
		c.own[key]++
	}
	c.mu.Unlock()
	c.watch.Changed(ctx, key)
}

// Settle announces key again and waits, at most max, until this process
// heard its own announcement back: by then the storage has sent it to
// every replica (see Watch.ChangedAndWait). For a change a person made and
// is told is done, after Wrote or Deleted.
func (c *Cache[V]) Settle(ctx context.Context, key string, max time.Duration) {
	c.watch.ChangedAndWait(ctx, key, max)
}

// Len returns the number of entries.
func (c *Cache[V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
