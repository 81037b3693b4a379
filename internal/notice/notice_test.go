package notice

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

type recorder struct {
	got    []string
	broken bool
}

func (r *recorder) send(msg []byte) error {
	if r.broken {
		return errors.New("stream gone")
	}
	r.got = append(r.got, string(msg))
	return nil
}

func TestSendGoesToTheLatestStream(t *testing.T) {
	b := New()
	first, second, other := &recorder{}, &recorder{}, &recorder{}
	b.Attach("s1", first.send)
	detach := b.Attach("s1", second.send)
	b.Attach("s2", other.send)
	if !b.Send("s1", []byte("a")) {
		t.Fatal("not delivered with two streams open")
	}
	if len(first.got) != 0 || !slices.Equal(second.got, []string{"a"}) || len(other.got) != 0 {
		t.Fatalf("first %v, second %v, other session %v", first.got, second.got, other.got)
	}
	detach()
	b.Send("s1", []byte("b"))
	second.broken = true // a stream that broke is passed over
	if !slices.Equal(first.got, []string{"b"}) || !slices.Equal(second.got, []string{"a"}) {
		t.Fatalf("after detaching the second: first %v, second %v", first.got, second.got)
	}
}

func TestNoticesWaitForAStream(t *testing.T) {
	b := New()
	broken := &recorder{broken: true}
	b.Attach("s", broken.send)
	if b.Send("s", []byte("1")) {
		t.Fatal("reported delivered on a broken stream")
	}
	for i := 2; i <= maxWaiting+2; i++ {
		b.Send("s", fmt.Appendf(nil, "%d", i))
	}
	r := &recorder{}
	b.Attach("s", r.send)
	if len(r.got) != maxWaiting || r.got[0] != "3" || r.got[maxWaiting-1] != fmt.Sprint(maxWaiting+2) {
		t.Fatalf("delivered on attach: %v (want the latest %d, in order)", r.got, maxWaiting)
	}
	again := &recorder{}
	b.Attach("s", again.send)
	if len(again.got) != 0 {
		t.Fatalf("delivered twice: %v", again.got)
	}
}

func TestAnEndedSessionsNoticesGo(t *testing.T) {
	b := New()
	b.Send("s", []byte("1"))
	b.Forget("s")
	r := &recorder{}
	b.Attach("s", r.send)
	if len(r.got) != 0 || len(b.waiting) != 0 {
		t.Fatalf("an ended session's notices: delivered %v, %d sessions waiting", r.got, len(b.waiting))
	}
}

func TestWaitingNoticesExpire(t *testing.T) {
	clock := time.Unix(1_000_000, 0)
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = time.Now })
	b := New()
	b.Send("s", []byte("old"))
	clock = clock.Add(waitFor + time.Second)
	b.Send("s", []byte("new"))
	r := &recorder{}
	b.Attach("s", r.send)
	if !slices.Equal(r.got, []string{"new"}) {
		t.Fatalf("delivered %v, want only the notice that had not expired", r.got)
	}
}

func TestWaitingIsBounded(t *testing.T) {
	clock := time.Unix(1_000_000, 0)
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = time.Now })
	b := New()
	for i := range maxSessions {
		b.Send(fmt.Sprint("s", i), []byte("x"))
	}
	b.Send("one more", []byte("x"))
	if len(b.waiting) != maxSessions {
		t.Fatalf("%d sessions waiting, want the bound %d", len(b.waiting), maxSessions)
	}
	// Once the waiting ones expired, new ones wait again.
	clock = clock.Add(waitFor + time.Second)
	b.Send("later", []byte("y"))
	if len(b.waiting) != 1 || len(b.waiting[digest("later")]) != 1 {
		t.Fatalf("after expiry: %d sessions waiting", len(b.waiting))
	}
}
