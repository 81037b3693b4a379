package mcp2026

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// fakeStream is an upstream standalone stream whose messages the test
// sends, counting how often it was opened and whether it was stopped.
type fakeStream struct {
	opened  atomic.Int32
	msgs    chan mcpmsg.Message
	stopped chan struct{}
}

func newFakeStream() *fakeStream {
	return &fakeStream{msgs: make(chan mcpmsg.Message), stopped: make(chan struct{})}
}

func (f *fakeStream) open(ctx context.Context) (func() (mcpmsg.Message, error), func(), error) {
	f.opened.Add(1)
	next := func() (mcpmsg.Message, error) {
		select {
		case m, ok := <-f.msgs:
			if !ok {
				return m, io.EOF
			}
			return m, nil
		case <-ctx.Done():
			return mcpmsg.Message{}, ctx.Err()
		}
	}
	return next, func() { close(f.stopped) }, nil
}

func all(mcpmsg.Message) bool { return true }

func note(method string) mcpmsg.Message {
	return mcpmsg.Message{Kind: mcpmsg.Notification, Method: method}
}

func receive(t *testing.T, ch <-chan mcpmsg.Message) (mcpmsg.Message, bool) {
	t.Helper()
	select {
	case m, ok := <-ch:
		return m, ok
	case <-time.After(5 * time.Second):
		t.Fatal("no message within 5 s")
		return mcpmsg.Message{}, false
	}
}

// The listens of one session share one upstream stream: each gets every
// message; it is stopped only after the last one left, and a listen that
// joins within ListenLinger takes it over.
func TestListensShareOneStream(t *testing.T) {
	rt := &Runtime{}
	f := newFakeStream()
	ctx := context.Background()
	a, leaveA, err := rt.Listen(ctx, "s1", all, f.open)
	if err != nil {
		t.Fatal(err)
	}
	b, leaveB, err := rt.Listen(ctx, "s1", all, f.open)
	if err != nil {
		t.Fatal(err)
	}
	f.msgs <- note("notifications/tools/list_changed")
	for _, ch := range []<-chan mcpmsg.Message{a, b} {
		if m, ok := receive(t, ch); !ok || m.Method != "notifications/tools/list_changed" {
			t.Fatalf("a listen got %v %v", m, ok)
		}
	}
	leaveA()
	leaveB()
	c, leaveC, err := rt.Listen(ctx, "s1", all, f.open)
	if err != nil {
		t.Fatal(err)
	}
	f.msgs <- note("notifications/prompts/list_changed")
	if m, ok := receive(t, c); !ok || m.Method != "notifications/prompts/list_changed" {
		t.Fatalf("the listen that took the stream over got %v %v", m, ok)
	}
	if n := f.opened.Load(); n != 1 {
		t.Fatalf("the upstream stream was opened %d times for three listens", n)
	}
	leaveC()
	select {
	case <-f.stopped:
	case <-time.After(ListenLinger + 5*time.Second):
		t.Fatal("the stream was not closed after its last listen left")
	}
	if _, ok := receive(t, c); ok {
		t.Fatal("a listen that left got a message")
	}
}

// A listen that falls behind is ended; the others keep the stream. When
// the upstream ends the stream, every listen's channel closes.
func TestListensSlowListenEnds(t *testing.T) {
	rt := &Runtime{}
	f := newFakeStream()
	slow, leaveSlow, _ := rt.Listen(context.Background(), "s1", all, f.open)
	defer leaveSlow()
	fast, leaveFast, _ := rt.Listen(context.Background(), "s1", all, f.open)
	defer leaveFast()
	// A listen that wants none of it is neither sent it nor ended.
	other, leaveOther, _ := rt.Listen(context.Background(), "s1", func(m mcpmsg.Message) bool { return m.Method != "notifications/resources/updated" }, f.open)
	defer leaveOther()
	for range ListenBacklog + 1 {
		f.msgs <- note("notifications/resources/updated")
		if _, ok := receive(t, fast); !ok {
			t.Fatal("the listen that keeps up was ended")
		}
	}
	for range ListenBacklog {
		if _, ok := receive(t, slow); !ok {
			t.Fatal("the slow listen lost a message before its backlog was full")
		}
	}
	if _, ok := receive(t, slow); ok {
		t.Fatal("the slow listen was not ended")
	}
	f.msgs <- note("notifications/tools/list_changed")
	if m, ok := receive(t, other); !ok || m.Method != "notifications/tools/list_changed" {
		t.Fatalf("the listen that wanted none of the updates got %v %v", m, ok)
	}
	if _, ok := receive(t, fast); !ok {
		t.Fatal("the listen that keeps up was ended")
	}
	close(f.msgs)
	if _, ok := receive(t, fast); ok {
		t.Fatal("the stream ended upstream and a listen goes on")
	}
}

// A stream that cannot be opened fails its first listen and those waiting
// for it; the next listen opens it anew.
func TestListensFailedOpen(t *testing.T) {
	rt := &Runtime{}
	refused := errors.New("405")
	release := make(chan struct{})
	failing := func(context.Context) (func() (mcpmsg.Message, error), func(), error) {
		<-release
		return nil, nil, refused
	}
	errs := make(chan error, 1)
	go func() {
		_, _, err := rt.Listen(context.Background(), "s1", all, failing)
		errs <- err
	}()
	for { // wait until the first listen is opening the stream
		rt.listens.mu.Lock()
		opening := rt.listens.streams["s1"] != nil
		rt.listens.mu.Unlock()
		if opening {
			break
		}
		time.Sleep(time.Millisecond)
	}
	go func() { time.Sleep(10 * time.Millisecond); close(release) }()
	if _, _, err := rt.Listen(context.Background(), "s1", all, failing); !errors.Is(err, refused) {
		t.Fatalf("a listen waiting for the opening: %v", err)
	}
	if err := <-errs; !errors.Is(err, refused) {
		t.Fatalf("the listen that opened: %v", err)
	}
	f := newFakeStream()
	if _, leave, err := rt.Listen(context.Background(), "s1", all, f.open); err != nil || f.opened.Load() != 1 {
		t.Fatalf("the next listen: %v, opened %d", err, f.opened.Load())
	} else {
		leave()
	}
}

// A resource is subscribed upstream by its first holder and unsubscribed
// by its last; a failed subscribe holds nothing.
func TestListensCountSubscriptions(t *testing.T) {
	rt := &Runtime{}
	var subs, unsubs int
	subscribe := func() bool { subs++; return true }
	unsubscribe := func() { unsubs++ }
	first, second := rt.Subscribe("k", subscribe, unsubscribe), rt.Subscribe("k", subscribe, unsubscribe)
	if !first || !second {
		t.Fatal("subscribing failed")
	}
	rt.Unsubscribe("k")
	if subs != 1 || unsubs != 0 {
		t.Fatalf("two holders, one left: %d subscribes, %d unsubscribes", subs, unsubs)
	}
	rt.Unsubscribe("k")
	if unsubs != 1 {
		t.Fatalf("the last holder left: %d unsubscribes", unsubs)
	}
	if rt.Subscribe("k", func() bool { return false }, unsubscribe) {
		t.Fatal("a failed subscribe reported the resource subscribed")
	}
	if !rt.Subscribe("k", subscribe, unsubscribe) || subs != 2 {
		t.Fatalf("subscribing after a failure: %d subscribes", subs)
	}
	rt.Unsubscribe("k")
	if unsubs != 2 || len(rt.listens.subs) != 0 {
		t.Fatalf("%d unsubscribes, %d entries left", unsubs, len(rt.listens.subs))
	}
}
