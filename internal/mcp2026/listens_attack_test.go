package mcp2026

import (
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// Attack: a listen whose resources/subscribe failed still holds the
// subscription's count until it lets go of it, and its release did not
// unsubscribe upstream. If another listen subscribes the resource
// successfully and ends in that window, its Unsubscribe is not the last
// (the failed one is still counted) and does not unsubscribe; the failed
// listen's Unsubscribe then is the last, finds the resource subscribed
// upstream, and leaves it so, and the entry is dropped: the upstream stays
// subscribed with no listen naming the resource, and nothing will ever
// unsubscribe it. Every successful subscribe must be matched by an
// unsubscribe once no listen holds the resource. The interleaving is a
// race, so it is tried a bounded number of times.
func TestListensAttackFailedSubscribeStrandsAnother(t *testing.T) {
	rt := &Runtime{}
	var subscribed, unsubscribed atomic.Int32
	aIn := atomic.Int32{}
	aIn.Store(-1)
	for i := range 100_000 {
		key := "s\x001\x00test://r" + strconv.Itoa(i)
		release := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { // A: its subscribe fails
			defer wg.Done()
			if rt.Subscribe(key, func() bool { aIn.Store(int32(i)); <-release; return false }, func() { unsubscribed.Add(1) }) {
				rt.Unsubscribe(key)
			}
		}()
		for n := 0; aIn.Load() != int32(i); n++ { // A is subscribing upstream
			if n > 50_000_000 {
				t.Fatalf("try %d: A never subscribed", i)
			}
			runtime.Gosched()
		}
		go func() { // B: subscribes, and its listen ends at once
			defer wg.Done()
			if rt.Subscribe(key, func() bool { subscribed.Add(1); return true }, func() { unsubscribed.Add(1) }) {
				rt.Unsubscribe(key)
			}
		}()
		if !rt.waitHolders(key, 2) {
			t.Fatalf("try %d: B never counted", i)
		}
		close(release)
		wg.Wait()
		if s, u := subscribed.Load(), unsubscribed.Load(); s != u {
			t.Fatalf("after %d tries: the upstream was subscribed %d times and unsubscribed %d times, and no listen holds the resource (entry kept: %v)",
				i+1, s, u, rt.holders(key) >= 0)
		}
	}
}

// waitHolders spins (bounded) until n listens hold key.
func (rt *Runtime) waitHolders(key string, n int) bool {
	for range 50_000_000 {
		if rt.holders(key) == n {
			return true
		}
		runtime.Gosched()
	}
	return false
}

// holders is the count of listens holding key, -1 when it has no entry.
func (rt *Runtime) holders(key string) int {
	rt.listens.mu.Lock()
	defer rt.listens.mu.Unlock()
	s := rt.listens.subs[key]
	if s == nil {
		return -1
	}
	return s.n
}
