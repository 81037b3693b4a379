package mcpstate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/internal/mcpstate"
	"github.com/toolgate/toolgate/internal/storetest"
	"github.com/toolgate/toolgate/modules/gateway"
)

func raceRecord(user string) *mcpstate.Record {
	return &mcpstate.Record{Ref: mcpstate.NewRef(), User: user, Service: "svc", Created: time.Now(), Expires: time.Now().Add(time.Hour),
		Upstream: mcpstate.Upstream{SessionID: "up", ProtocolVersion: "2025-11-25", Generation: 1}, Initialize: []byte(`{}`)}
}

// Attack (fixed): a caller at max_mcp_sessions_per_caller opens sessions through
// two replicas at once: CountUser at the limit deletes every index entry
// whose state it cannot Stat, which includes a session another replica is
// creating (Create writes the entry, a mark, then the state). That
// session lives on with no index entry, so it is never counted again: the
// caller holds 2 sessions while the count says 1, and a third passes a
// limit of 2.
// Fixed: CountUser keeps and counts an entry whose record is missing while it is younger than written.Grace (a creation under way).
func TestRaceCountUserDropsIndexOfSessionBeingCreated(t *testing.T) {
	ctx := context.Background()
	base := gateway.SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	gate := storetest.NewGate(base, func(key string) bool {
		return strings.HasPrefix(key, mcpstate.Prefix+"/sessions/") && strings.HasSuffix(key, "/state")
	})
	now := time.Now
	a := mcpstate.New(base, time.Hour, 12*time.Hour, now) // replica A
	b := mcpstate.New(base, time.Hour, 12*time.Hour, now) // replica B
	slow := mcpstate.New(gate, time.Hour, 12*time.Hour, now)
	const limit = 2
	if _, err := a.Create(ctx, raceRecord("alice")); err != nil {
		t.Fatal(err)
	}
	second := raceRecord("alice")
	done := make(chan error, 1)
	go func() { _, err := slow.Create(ctx, second); done <- err }()
	gate.Wait(t) // the second session's index entry and mark are stored, its state is on its way
	if _, err := b.CountUser(ctx, "alice", limit); err != nil {
		t.Fatal(err)
	}
	gate.Open()
	if err := <-done; err != nil {
		t.Fatalf("Create: %v", err)
	}
	if _, err := b.Load(ctx, second.Ref); err != nil {
		t.Fatalf("the second session does not exist: %v", err)
	}
	n, err := b.CountUser(ctx, "alice", limit)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("alice holds 2 MCP sessions, CountUser says %d: one more passes max_mcp_sessions_per_caller %d", n, limit)
	}
}

// Attack (fixed): a session ended (DELETE, or the idle sweep) while a
// server→client request of it is being recorded (another replica relays
// an elicitation or sampling request): End's RemoveAll of the session's
// directory races the write into it. End then fails ("directory not
// empty") after it already deleted the state — the caller is told the
// session could not be ended, the index entry stays, nothing is
// announced (other replicas with a live cache keep the record), and the
// idle sweep stops at that error — or the write resurrects the directory
// without a state. Counts how often in a bounded loop.
// Fixed: End deletes the record first and removes the directory best effort without failing, and writers store below a record only while it exists, removing their write again when the session ended meanwhile.
func TestRaceEndRacesWritesIntoTheSessionDirectory(t *testing.T) {
	ctx := context.Background()
	base := gateway.SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	a := mcpstate.New(base, time.Hour, 12*time.Hour, time.Now)
	b := mcpstate.New(base, time.Hour, 12*time.Hour, time.Now)
	deadline := time.Now().Add(3 * time.Second)
	tries, endFailed, stateGoneButFailed, leftover := 0, 0, 0, 0
	var firstErr error
	for time.Now().Before(deadline) && endFailed == 0 {
		tries++
		rec := raceRecord("alice")
		if _, err := a.Create(ctx, rec); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					_ = b.ServerRequestSent(ctx, rec.Ref, fmt.Sprintf("%d-%d", w, i), mcpstate.PendingRequest{Method: "elicitation/create"})
				}
			}()
		}
		time.Sleep(time.Millisecond)
		_, err := a.End(ctx, rec.Ref, false)
		close(stop)
		wg.Wait()
		if _, err := base.Stat(ctx, mcpstate.Prefix+"/sessions/"+rec.Ref); err == nil {
			leftover++
		}
		if err != nil && !errors.Is(err, mcpstate.ErrNotFound) {
			endFailed++
			if firstErr == nil {
				firstErr = err
			}
			if _, lerr := b.Load(ctx, rec.Ref); errors.Is(lerr, mcpstate.ErrNotFound) {
				stateGoneButFailed++
			}
		}
	}
	t.Logf("%d tries, End failed %d times (state already deleted in %d), directory left %d times", tries, endFailed, stateGoneButFailed, leftover)
	if endFailed > 0 {
		t.Errorf("End failed while a write went into the session's directory: %v", firstErr)
	}
	if leftover > 0 {
		t.Errorf("an ended session's directory was left (or recreated) by the writes racing End %d times", leftover)
	}
}

// Attack (fixed): a runner sends its answer to one server→client request (an
// elicitation's, a sampling's) to two replicas at once: both find the
// pending request and both are told it is theirs to relay, because
// ServerRequestAnswered reads and deletes without a lock (and the
// file_system's Delete succeeds on a key already gone) — the upstream is
// sent two answers to one request, each treated as the answer.
// Fixed: ServerRequestAnswered reads and deletes the request under the request's own storage lock, so one caller finds it.
func TestRaceServerRequestAnsweredTwice(t *testing.T) {
	ctx := context.Background()
	base := gateway.SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	a := mcpstate.New(base, time.Hour, 12*time.Hour, time.Now)
	b := mcpstate.New(base, time.Hour, 12*time.Hour, time.Now)
	rec := raceRecord("alice")
	if _, err := a.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	tries, twice := 0, 0
	for time.Now().Before(deadline) && twice == 0 {
		tries++
		id := fmt.Sprint(tries)
		if err := a.ServerRequestSent(ctx, rec.Ref, id, mcpstate.PendingRequest{Method: "elicitation/create"}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		got := make([]bool, 2)
		start := make(chan struct{})
		for i, s := range []*mcpstate.Store{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, ok, err := s.ServerRequestAnswered(ctx, rec.Ref, id)
				if err != nil {
					t.Error(err)
				}
				got[i] = ok
			}()
		}
		close(start)
		wg.Wait()
		if got[0] && got[1] {
			twice++
		}
	}
	t.Logf("%d tries, answered twice %d times", tries, twice)
	if twice > 0 {
		t.Errorf("one server request's answer was taken by two replicas")
	}
}
