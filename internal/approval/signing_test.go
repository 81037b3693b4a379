package approval

import (
	"context"
	"errors"
	"io/fs"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/modules/gateway"
)

// Attack: a record's MAC is an HMAC of json.Marshal of the record as it
// is in memory (approval.go sign). encoding/json writes an invalid UTF-8
// byte as the escape \ufffd, but the record read back holds U+FFFD itself,
// which it writes as its three raw bytes: the MAC computed at save and the
// one computed at Get differ. A decision whose note is not UTF-8 — the
// console's decide form passes r.PostFormValue("note") (note=%FF) to
// Decide unchecked — leaves an approved record Get reports as not found
// ("changed outside toolgate"): the approved call is never released, and
// the next sweep deletes the record. The same holds for any field of the
// record (a policy's reason built with base64.decode, say).
func TestRegressionAttackNonUTF8NoteMakesDecisionVanish(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	s := testStore(storage)
	a := &Approval{ID: "a1", State: StatePending, Requester: "alice", Approvers: []string{"carol"}, Scopes: []string{ScopeOnce},
		CreatedAt: now().UTC(), ExpiresAt: now().Add(time.Hour).UTC(), Sealed: []byte("sealed")}
	if err := s.save(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Decide(ctx, "a1", &gateway.Caller{User: "carol"}, true, ScopeOnce, "ok \xff"); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	got, err := s.Get(ctx, "a1")
	if err != nil {
		t.Errorf("the approval carol approved (with a note that is not UTF-8) reads back as %v: the approved call is never released", err)
	} else if got.State != StateApproved {
		t.Errorf("state %q, want approved", got.State)
	}
	if _, err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := storage.Load(ctx, recordKey("a1")); errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the sweep deleted the approved (unexpired, unconsumed) record as one changed outside toolgate")
	}
}

// Attack: the same at creation: a reason that is not UTF-8 makes the
// pending approval unreadable at once (nobody can decide it; the sweep
// deletes it).
func TestRegressionAttackNonUTF8ReasonMakesPendingVanish(t *testing.T) {
	ctx := context.Background()
	s := testStore(&certmagic.FileStorage{Path: t.TempDir()})
	a := &Approval{ID: "b1", State: StatePending, Requester: "alice", Reason: "writes \xe2\x82", Scopes: []string{ScopeOnce},
		CreatedAt: now().UTC(), ExpiresAt: now().Add(time.Hour).UTC()}
	if err := s.Create(ctx, a, Contents{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "b1"); err != nil {
		t.Errorf("a pending approval whose reason is not UTF-8 reads back as %v", err)
	}
}
