package mcpstate_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/internal/mcpstate"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/storetest"
	"github.com/toolgate/toolgate/modules/gateway"
)

// holdDirDelete is a storage whose first Delete of a session's directory
// (End's removeDir) waits until release: the moment between End deleting
// the record and removing what is below it, which in the gateway lasts as
// long as End's ChangedAndWait (up to a second), or for good when the
// removal fails.
type holdDirDelete struct {
	certmagic.Storage
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func (h *holdDirDelete) Delete(ctx context.Context, key string) error {
	rest, ok := strings.CutPrefix(key, mcpstate.Prefix+"/sessions/")
	if ok && !strings.Contains(rest, "/") {
		hold := false
		h.once.Do(func() { hold = true })
		if hold {
			close(h.held)
			select {
			case <-h.release:
			case <-time.After(5 * time.Second):
			}
		}
	}
	return h.Storage.Delete(ctx, key)
}

// Attack (fixed): a runner's answer to a server→client request of a session that
// has ended is taken (ok, with its method) and so relayed upstream. End
// now deletes the record first and the directory with the pending
// requests only afterwards (after its announcement, best effort), and
// ServerRequestAnswered reads the request without looking at the record:
// between the two — up to End's one-second wait for its announcement, or
// for good when removeDir gave up — a replica whose copy of the session
// is still fresh accepts answers of an ended session. Before the change,
// End removed the requests with the record under the session's lock.
// Fixed: ServerRequestAnswered and Task check that the record still exists (one Stat) before taking what they found below it.
func TestReviewAnswerOfAnEndedSessionIsTaken(t *testing.T) {
	ctx := context.Background()
	base := gateway.SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	h := &holdDirDelete{Storage: base, held: make(chan struct{}), release: make(chan struct{})}
	defer func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
	}()
	s := mcpstate.New(h, time.Hour, 12*time.Hour, time.Now)
	rec := raceRecord("alice")
	if _, err := s.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := s.ServerRequestSent(ctx, rec.Ref, "7", mcpstate.PendingRequest{Method: "sampling/createMessage"}); err != nil {
		t.Fatal(err)
	}
	keys, err := seal.New(mcpstate.Purpose, []byte("review-state-secret-0123456789-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.TaskCreated(ctx, keys, rec.Ref, "task-1", mcpstate.TaskCall{Tool: "transfer"}); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { _, err := s.End(ctx, rec.Ref, false); ended <- err }()
	select {
	case <-h.held:
	case <-time.After(5 * time.Second):
		t.Fatal("End never removed the directory")
	}
	if _, err := s.Load(ctx, rec.Ref); !errors.Is(err, mcpstate.ErrNotFound) {
		t.Fatalf("the session has not ended yet: %v", err)
	}
	req, ok, err := s.ServerRequestAnswered(ctx, rec.Ref, "7")
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		t.Errorf("the answer to %q of an ended session was taken (it is relayed upstream)", req.Method)
	}
	if task, ok, err := s.Task(ctx, keys, rec.Ref, "task-1"); err == nil && ok {
		t.Errorf("the task of an ended session is still found (%s): its requests are decided as that call's", task.Tool)
	}
	close(h.release)
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
}

// Holds: a server request recorded while End runs (its write held between
// storeBelow's check and its Store, End complete meanwhile) is refused
// with ErrNotFound and leaves nothing below the ended session.
func TestReviewHoldsRequestRecordedAcrossEndLeavesNothing(t *testing.T) {
	ctx := context.Background()
	base := gateway.SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	gate := storetest.NewGate(base, func(key string) bool { return strings.Contains(key, "/pending/") })
	a := mcpstate.New(base, time.Hour, 12*time.Hour, time.Now)
	slow := mcpstate.New(gate, time.Hour, 12*time.Hour, time.Now)
	rec := raceRecord("alice")
	if _, err := a.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- slow.ServerRequestSent(ctx, rec.Ref, "1", mcpstate.PendingRequest{Method: "elicitation/create"})
	}()
	gate.Wait(t)
	if _, err := a.End(ctx, rec.Ref, false); err != nil {
		t.Fatal(err)
	}
	gate.Open()
	if err := <-done; !errors.Is(err, mcpstate.ErrNotFound) {
		t.Errorf("recording a request across End: %v, want ErrNotFound", err)
	}
	if keys, err := base.List(ctx, mcpstate.Prefix+"/sessions/"+rec.Ref, true); err == nil && len(keys) > 0 {
		t.Errorf("left below the ended session: %q", keys)
	}
}
