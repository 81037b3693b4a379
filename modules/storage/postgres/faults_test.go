package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/pgtest"
)

// TestFaults stops PostgreSQL under a writer: every operation then fails
// with a clear, retryable error; no acknowledged write is lost and no
// value is half written; once PostgreSQL is back the same module works
// again, its lock survived, and subscribers are told to reset.
func TestFaults(t *testing.T) {
	srv := pgtest.Start(t)
	s := newStorage(t, srv.DSN("postgres"), "faults", 2*time.Second)
	ctx := t.Context()
	mustStore(t, ctx, s, "k", []byte("v1"))
	if err := s.Lock(ctx, "held"); err != nil {
		t.Fatal(err)
	}
	onS := changes(t, s, "")
	if c := next(t, onS); !c.Reset {
		t.Fatalf("first change %+v, want Reset", c)
	}

	// a writer stores 64 KiB values until told to stop
	value := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 64<<10) }
	var (
		mu    sync.Mutex
		acked []int
		wrote = make(chan struct{}, 1000)
		stop  = make(chan struct{})
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if s.Store(ctx, fmt.Sprintf("w/%04d", i), value(i)) == nil {
				mu.Lock()
				acked = append(acked, i)
				mu.Unlock()
			}
			wrote <- struct{}{}
		}
	}()
	for range 20 {
		<-wrote
	}
	srv.Stop(t)
	for range 5 {
		<-wrote // some writes fail meanwhile
	}
	close(stop)
	<-done

	for name, err := range map[string]error{
		"Store":   s.Store(ctx, "k", []byte("v2")),
		"Load":    second(s.Load(ctx, "k")),
		"Delete":  s.Delete(ctx, "k"),
		"List":    second(s.List(ctx, "", true)),
		"Stat":    second(s.Stat(ctx, "k")),
		"TryLock": second(s.TryLock(ctx, "other")),
		"Lock":    s.Lock(ctx, "other"),
		"Publish": s.Publish(ctx, "k"),
	} {
		if !errors.Is(err, ErrUnavailable) || !strings.HasPrefix(err.Error(), "postgres storage: ") {
			t.Errorf("%s while PostgreSQL is down: %v, want a postgres storage error wrapping ErrUnavailable", name, err)
		}
	}
	if s.Exists(ctx, "k") {
		t.Error("Exists while PostgreSQL is down = true")
	}

	srv.Restart(t)
	if got := mustLoadPG(t, s, "k"); string(got) != "v1" {
		t.Fatalf("k = %q after the failed store and delete, want v1", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(acked) < 20 {
		t.Fatalf("only %d writes acknowledged before the stop", len(acked))
	}
	for _, i := range acked {
		if got := mustLoadPG(t, s, fmt.Sprintf("w/%04d", i)); !bytes.Equal(got, value(i)) {
			t.Fatalf("acknowledged value %d: %d bytes, not what was stored", i, len(got))
		}
	}
	stored, err := s.List(ctx, "w", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range stored { // including any whose acknowledgement was lost
		var i int
		fmt.Sscanf(k, "w/%04d", &i)
		if got := mustLoadPG(t, s, k); !bytes.Equal(got, value(i)) {
			t.Fatalf("%s is half written: %d bytes", k, len(got))
		}
	}

	mustStore(t, ctx, s, "k", []byte("v3"))
	if got := mustLoadPG(t, s, "k"); string(got) != "v3" {
		t.Fatalf("k = %q after storing v3", got)
	}
	if c := next(t, onS); !c.Reset || !c.Lost {
		t.Fatalf("after PostgreSQL stopped: %+v, want Reset and Lost", c)
	}
	if c := next(t, onS); !c.Reset || c.Lost {
		t.Fatalf("after PostgreSQL came back: %+v, want Reset, not Lost", c)
	}
	if err := s.Publish(ctx, "after"); err != nil {
		t.Fatal(err)
	}
	if c := next(t, onS); c.Key != "after" {
		t.Fatalf("after reconnecting: %+v", c)
	}
	if err := s.Unlock(ctx, "held"); err != nil {
		t.Fatalf("Unlock of the lock held through the outage: %v", err)
	}
	lockCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := s.Lock(lockCtx, "other"); err != nil {
		t.Fatal(err)
	}
	if err := s.Unlock(ctx, "other"); err != nil {
		t.Fatal(err)
	}
}

func second[T any](_ T, err error) error { return err }
