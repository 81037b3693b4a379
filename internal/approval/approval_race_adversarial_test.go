package approval

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/storecache"
	"github.com/toolgate/toolgate/internal/storetest"
	"github.com/toolgate/toolgate/modules/gateway"
)

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
		gate := storetest.NewGate(base, func(key string) bool { return strings.HasPrefix(key, at) })
		slow := testStore(gate)
		slow.cipher, slow.macKey = a.cipher, a.macKey
		done := make(chan error, 1)
		go func() { done <- slow.Create(ctx, p, Contents{Arguments: []byte(`{"x":1}`)}) }()
		gate.Wait(t)
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
		gate.Open()
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

// Holds: replicas starting on an empty storage at once make one
// approvals' MAC key between them (made under a storage lock, read again
// under it), so a record one signs is an approval to the others.
func TestRaceReplicasAgreeOnTheMACKey(t *testing.T) {
	ctx := context.Background()
	base := gateway.SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	first := testStore(base)
	stores := []*Store{first, testStore(base), testStore(base)}
	for _, s := range stores[1:] {
		s.cipher = first.cipher
	}
	keys := make([][]byte, len(stores))
	var wg sync.WaitGroup
	for i, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, err := s.key(ctx)
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		}()
	}
	wg.Wait()
	for i := range keys[1:] {
		if string(keys[i+1]) != string(keys[0]) {
			t.Fatalf("replica %d made another MAC key", i+1)
		}
	}
}

// raceManager is a replica's Manager over storage, with its withheld
// marks followed as NewManager sets them up (no announcements: the
// file_system storage has none).
func raceManager(storage certmagic.Storage, cipher gateway.Cipher) *Manager {
	st := testStore(storage)
	st.cipher = cipher
	w := storecache.NewWatch(storage, withheldPrefix)
	return &Manager{Store: st, app: &gateway.App{}, cfg: Config{MaxPendingPerUser: DefaultMaxPendingPerUser},
		audit: zap.NewNop(), logger: zap.NewNop(), waiting: map[string][]chan struct{}{}, results: map[string]time.Time{},
		watches: map[string]struct{}{}, watching: map[string]int{},
		withheld: w, withheldCache: storecache.NewCache[time.Time](w, time.Minute, func() time.Time { return now() })}
}

// Attack (fixed): two results of one session withheld at once through two
// replicas (one ask with a ttl of an hour, one of five minutes) leave the
// session's withheld mark with the earlier expiry: noteResult reads the
// mark, compares and writes it back without a lock, and the replica with
// the earlier expiry writes last. Once that passes, a third replica's
// MayRelease says no withheld result can be waiting, so the approved
// hour-long result is never looked up there: the identical retry goes
// upstream again (the tool runs a second time) instead of getting the
// result the approver released.
// Fixed: noteResult reads, compares and writes the mark under the mark's storage lock (markWithheld), so the later expiry stays.
func TestRaceWithheldMarkLosesTheLaterExpiry(t *testing.T) {
	ctx := context.Background()
	clock := time.Now().UTC()
	orig := now
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = orig })
	base := gateway.SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	a := raceManager(base, testStore(base).cipher)
	gate := storetest.NewGate(base, func(key string) bool { return strings.HasPrefix(key, withheldPrefix+"/") })
	b := raceManager(gate, a.Store.cipher)
	c := raceManager(base, a.Store.cipher)

	long := &Approval{ID: "long", Stage: StageResult, Requester: "alice", Session: "s1", ExpiresAt: clock.Add(time.Hour)}
	short := &Approval{ID: "short", Stage: StageResult, Requester: "alice", Session: "s1", ExpiresAt: clock.Add(5 * time.Minute)}
	done := make(chan struct{})
	go func() { b.noteResult(ctx, short); close(done) }()
	gate.Wait(t) // B read no mark and is writing its five minutes
	noted := make(chan struct{})
	go func() { a.noteResult(ctx, long); close(noted) }()
	select { // A writes meanwhile, unless a lock makes it wait for B
	case <-noted:
	case <-time.After(200 * time.Millisecond):
	}
	gate.Open()
	<-done
	<-noted

	clock = clock.Add(10 * time.Minute) // the short one expired, the long one waits
	if !c.MayRelease(ctx, "alice", "s1") {
		t.Errorf("a result withheld until %s is waiting, but another replica's MayRelease says none may be", long.ExpiresAt.Format(time.TimeOnly))
	}
}
