package mcp2026

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

type fakeHeld struct {
	mu       sync.Mutex
	released []string
}

func (f *fakeHeld) Release(why string) {
	f.mu.Lock()
	f.released = append(f.released, why)
	f.mu.Unlock()
}

// fakeTimers replaces afterFunc: timers fire when the test says.
type fakeTimers struct {
	mu  sync.Mutex
	fns []func()
	d   []time.Duration
}

func (ft *fakeTimers) afterFunc(d time.Duration, f func()) *time.Timer {
	ft.mu.Lock()
	ft.fns = append(ft.fns, f)
	ft.d = append(ft.d, d)
	ft.mu.Unlock()
	return time.NewTimer(time.Hour) // stopped by Take; never fires within a test
}

func (ft *fakeTimers) fire(i int) { ft.fns[i]() }

// A held exchange continues once, for its owner only; one that is not
// taken by its deadline is released; the count is bounded per owner and
// in all.
func TestHolds(t *testing.T) {
	ft := &fakeTimers{}
	afterFunc = ft.afterFunc
	t.Cleanup(func() { afterFunc = time.AfterFunc })
	rt := &Runtime{}
	a, b := &fakeHeld{}, &fakeHeld{}
	ida, err := rt.Hold("alice", a, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	idb, err := rt.Hold("alice", b, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if rt.Take(ida, "bob") != nil {
		t.Fatal("another owner took a held exchange")
	}
	if rt.Take(ida, "alice") != Held(a) {
		t.Fatal("the owner could not take its exchange")
	}
	if rt.Take(ida, "alice") != nil {
		t.Fatal("a held exchange was taken twice")
	}
	ft.fire(0) // a's deadline, after it was taken: nothing to release
	if len(a.released) != 0 {
		t.Fatalf("a taken exchange was released: %v", a.released)
	}
	ft.fire(1) // b's deadline
	if len(b.released) != 1 || rt.Take(idb, "alice") != nil || rt.HeldCount() != 0 {
		t.Fatalf("an expired exchange: released %v, still held %d", b.released, rt.HeldCount())
	}
	for i := range maxHeldPerOwner {
		if _, err := rt.Hold("carol", &fakeHeld{}, time.Now().Add(time.Minute)); err != nil {
			t.Fatalf("hold %d: %v", i, err)
		}
	}
	if _, err := rt.Hold("carol", &fakeHeld{}, time.Now().Add(time.Minute)); !errors.Is(err, ErrHeldFull) {
		t.Fatalf("hold over the owner's limit: %v", err)
	}
	for i := rt.HeldCount(); i < maxHeld; i++ {
		if _, err := rt.Hold("owner"+strconv.Itoa(i), &fakeHeld{}, time.Now().Add(time.Minute)); err != nil {
			t.Fatalf("hold %d: %v", i, err)
		}
	}
	if _, err := rt.Hold("dave", &fakeHeld{}, time.Now().Add(time.Minute)); !errors.Is(err, ErrHeldFull) {
		t.Fatalf("hold over the total limit: %v", err)
	}
}

// The records of used requestStates are swept once the states expired;
// until then a second use is refused.
func TestSweepUsed(t *testing.T) {
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	early := State{Nonce: "n1", Expires: now.Add(time.Minute).Unix()}
	late := State{Nonce: "n2", Expires: now.Add(time.Hour).Unix()}
	for _, st := range []State{early, late} {
		if err := consume(ctx, storage, st); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := sweepUsed(ctx, storage, now); err != nil || n != 0 {
		t.Fatalf("sweep before any expiry: %d %v", n, err)
	}
	if n, err := sweepUsed(ctx, storage, now.Add(2*time.Minute)); err != nil || n != 1 {
		t.Fatalf("sweep after the first expiry: %d %v", n, err)
	}
	if err := consume(ctx, storage, late); !errors.Is(err, ErrStateReplayed) {
		t.Fatalf("the unexpired state could be used again after a sweep: %v", err)
	}
	keys, _ := storage.List(ctx, usedPrefix, false)
	if len(keys) != 1 {
		t.Fatalf("records left: %v", keys)
	}
	if n, err := sweepUsed(ctx, &certmagic.FileStorage{Path: t.TempDir()}, now); err != nil || n != 0 {
		t.Fatalf("sweep of empty storage: %d %v", n, err)
	}
}

// One caller's held exchanges, across toolgate sessions and services, stop
// at maxHeldPerCaller: a few callers cannot take every place. Another
// caller still gets one, and a taken exchange gives its place back.
func TestHoldsPerCaller(t *testing.T) {
	ft := &fakeTimers{}
	afterFunc = ft.afterFunc
	t.Cleanup(func() { afterFunc = time.AfterFunc })
	rt := &Runtime{}
	var first string
	for i := range maxHeldPerCaller {
		owner := "mallory\x00session" + strconv.Itoa(i/maxHeldPerOwner) + "\x00svc" + strconv.Itoa(i%3)
		id, err := rt.Hold(owner, &fakeHeld{}, time.Now().Add(time.Minute))
		if err != nil {
			t.Fatalf("hold %d: %v", i, err)
		}
		if i == 0 {
			first = owner + " " + id
		}
	}
	if _, err := rt.Hold("mallory\x00another session\x00svc", &fakeHeld{}, time.Now().Add(time.Minute)); !errors.Is(err, ErrHeldFull) {
		t.Fatalf("a hold past the caller's limit, in a new session: %v", err)
	}
	if _, err := rt.Hold("alice\x00session\x00svc", &fakeHeld{}, time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("another caller's hold: %v", err)
	}
	owner, id, _ := strings.Cut(first, " ")
	if rt.Take(id, owner) == nil {
		t.Fatal("the first exchange could not be taken")
	}
	if _, err := rt.Hold("mallory\x00another session\x00svc", &fakeHeld{}, time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("a hold once a place was given back: %v", err)
	}
}
