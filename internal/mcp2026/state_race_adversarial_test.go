package mcp2026

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/modules/gateway"
)

// Holds: one requestState sent to several replicas at once is used once:
// consume checks and records its nonce under the storage lock named by
// it, and a sweep running meanwhile leaves a record that has not expired.
func TestRaceRequestStateConsumedOnceAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	base := gateway.SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	st := State{Caller: "alice", Service: "svc", Method: "tools/call", Expires: time.Now().Add(time.Minute).Unix(), Nonce: "n0nce-RACE_1"}
	var wg sync.WaitGroup
	var mu sync.Mutex
	used, replayed := 0, 0
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := consume(ctx, base, st)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				used++
			case errors.Is(err, ErrStateReplayed):
				replayed++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 20 {
			if _, err := sweepUsed(ctx, base, time.Now()); err != nil {
				t.Error(err)
			}
		}
	}()
	wg.Wait()
	if used != 1 || replayed != 2 {
		t.Fatalf("used %d times, refused as replayed %d times; want 1 and 2", used, replayed)
	}
	if err := consume(ctx, base, st); !errors.Is(err, ErrStateReplayed) {
		t.Errorf("after the sweep, the state is usable again: %v", err)
	}
}

// statFails is a storage whose Stat and Exists fail as a database that
// went away does (certmagic's Exists cannot say so: it answers false).
type statFails struct{ certmagic.Storage }

func (statFails) Stat(context.Context, string) (certmagic.KeyInfo, error) {
	return certmagic.KeyInfo{}, errors.New("connection refused")
}
func (statFails) Exists(context.Context, string) bool { return false }

// Attack (fixed): a requestState used once, then again while the storage
// cannot say whether its nonce was used: consume asked Exists, which
// answers false on a storage error, and the state was used twice. Fixed:
// it asks Stat, and an error is an error (the request is refused as
// retryable), never "not used".
func TestRaceRequestStateNotUsedTwiceWhileStorageFails(t *testing.T) {
	ctx := context.Background()
	base := gateway.SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	st := State{Caller: "alice", Service: "svc", Method: "tools/call", Expires: time.Now().Add(time.Minute).Unix(), Nonce: "n0nce-STAT_1"}
	if err := consume(ctx, base, st); err != nil {
		t.Fatal(err)
	}
	err := consume(ctx, statFails{base}, st)
	if err == nil {
		t.Fatal("a used requestState was used again while the storage could not be read")
	}
	if errors.Is(err, ErrStateReplayed) {
		t.Fatalf("the storage's failure reported as a replay: %v", err)
	}
}
