package approval

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/modules/gateway"
)

// raceGate is a storage that holds the first Store of a key match
// accepts until open is called: the moment a replica is between two of
// its writes, made to last.
type raceGate struct {
	certmagic.Storage
	mu      sync.Mutex
	match   func(key string) bool
	paused  chan struct{}
	release chan struct{}
}

func newRaceGate(s certmagic.Storage, match func(string) bool) *raceGate {
	return &raceGate{Storage: s, match: match, paused: make(chan struct{}), release: make(chan struct{})}
}

func (g *raceGate) Store(ctx context.Context, key string, value []byte) error {
	g.mu.Lock()
	hold := g.match != nil && g.match(key)
	if hold {
		g.match = nil
	}
	g.mu.Unlock()
	if hold {
		close(g.paused)
		select {
		case <-g.release:
		case <-time.After(5 * time.Second):
		}
	}
	return g.Storage.Store(ctx, key, value)
}

func (g *raceGate) wait(t *testing.T) {
	t.Helper()
	select {
	case <-g.paused:
	case <-time.After(5 * time.Second):
		t.Fatal("the gated write never came")
	}
}

func (g *raceGate) open() { close(g.release) }

func racePending(id string) *Approval {
	call := Call{Requester: "alice", Session: "s", Service: "svc", Method: "tools/call", Tool: "t", Arguments: []byte(`{"x":1}`)}
	callKey, toolKey, digest := call.Keys()
	return &Approval{ID: id, State: StatePending, Stage: StageRequest, Requester: "alice", Session: "s", Service: "svc",
		Method: "tools/call", Tool: "t", ArgumentsSHA256: digest, Approvers: []string{"carol", "dave"},
		Scopes: []string{ScopeOnce, ScopeSession}, CreatedAt: now().UTC(), ExpiresAt: now().Add(time.Hour).UTC(),
		CallKey: callKey, ToolKey: toolKey}
}

// Holds: two approvers deciding one approval through two replicas at
// once (one approves, one denies) get exactly one decision stored, and
// any number of identical retries on both replicas consume a once
// approval exactly once (Decide and Consume read and write under the
// approval's storage lock).
func TestRaceDecideAndConsumeAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	base := gateway.SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	a := testStore(base)
	b := testStore(base)
	b.cipher = a.cipher
	p := racePending("race1")
	if err := a.Create(ctx, p, Contents{Arguments: []byte(`{"x":1}`)}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, errs[0] = a.Decide(ctx, p.ID, &gateway.Caller{User: "carol"}, true, ScopeOnce, "")
	}()
	go func() {
		defer wg.Done()
		_, errs[1] = b.Decide(ctx, p.ID, &gateway.Caller{User: "dave"}, false, "", "")
	}()
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("two decisions: approve %v, deny %v; want exactly one", errs[0], errs[1])
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, ErrDecided) {
			t.Fatalf("the losing decision: %v", err)
		}
	}
	got, err := b.Get(ctx, p.ID)
	if err != nil {
		t.Fatal(err)
	}
	if (got.State == StateApproved) != (errs[0] == nil) {
		t.Fatalf("stored %s, but the decision that won was the other", got.State)
	}
	if got.State != StateApproved {
		return
	}
	var mu sync.Mutex
	consumed := 0
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := a
			if i%2 == 1 {
				s = b
			}
			_, ok, err := s.Consume(ctx, p.ID)
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				consumed++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if consumed != 1 {
		t.Errorf("a once approval was consumed %d times", consumed)
	}
}

// Holds: a replica looking for the identical call, or listing pending
// approvals, while another replica is creating the approval (held right
// after its record, before its index entries) neither fails nor deletes
// anything of it: index entries are written after the record, and the
// record after the contents, so a listing never meets an entry whose
// record is still to come.
func TestRaceListingsDuringCreate(t *testing.T) {
	ctx := context.Background()
	base := gateway.SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	a := testStore(base)
	b := testStore(base)
	b.cipher = a.cipher
	// The key is made first, so that the creation below is held only at
	// the write named.
	if _, err := a.key(ctx); err != nil {
		t.Fatal(err)
	}
	for _, at := range []string{contentsPrefix + "/", prefix + "/", byCallPrefix + "/"} {
		p := racePending("race-" + strings.ReplaceAll(strings.TrimPrefix(at, "toolgate/"), "/", ""))
		gate := newRaceGate(base, func(key string) bool { return strings.HasPrefix(key, at) })
		slow := testStore(gate)
		slow.cipher, slow.macKey = a.cipher, a.macKey
		done := make(chan error, 1)
		go func() { done <- slow.Create(ctx, p, Contents{Arguments: []byte(`{"x":1}`)}) }()
		gate.wait(t)
		if _, err := b.ForCall(ctx, p.CallKey, p.ToolKey); err != nil {
			t.Errorf("held at %s: ForCall: %v", at, err)
		}
		if _, err := b.Pending(ctx); err != nil {
			t.Errorf("held at %s: Pending: %v", at, err)
		}
		if _, err := b.OfRequester(ctx, "alice"); err != nil {
			t.Errorf("held at %s: OfRequester: %v", at, err)
		}
		if _, err := b.Sweep(ctx); err != nil {
			t.Errorf("held at %s: Sweep: %v", at, err)
		}
		gate.open()
		if err := <-done; err != nil {
			t.Fatalf("held at %s: Create: %v", at, err)
		}
		found, err := b.ForCall(ctx, p.CallKey, p.ToolKey)
		if err != nil || !containsID(found, p.ID) {
			t.Errorf("held at %s: the identical call does not find its approval: %v", at, err)
		}
		if n, err := b.CountPending(ctx, "alice"); err != nil || n < 1 {
			t.Errorf("held at %s: CountPending = %d, %v", at, n, err)
		}
		got, err := b.Get(ctx, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Open(ctx, got); err != nil {
			t.Errorf("held at %s: Open: %v", at, err)
		}
		if _, err := a.Decide(ctx, p.ID, &gateway.Caller{User: "carol"}, false, "", ""); err != nil {
			t.Fatal(err)
		}
	}
}

func containsID(list []*Approval, id string) bool {
	for _, a := range list {
		if a.ID == id {
			return true
		}
	}
	return false
}
