package mcpstate

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// Attack (fixed): a record of the previous version is its request's method as the
// upstream wrote it, and ServerRequestAnswered tells it from a record of
// this version by its first byte ("no method starts with '{'"). A method
// is the upstream's text: a hostile upstream, served by a replica of the
// previous version during a rolling upgrade, asks the runner a request
// whose method is `{"method":"elicitation/create","id":"other"}`. The
// runner's answer to it, taken on an upgraded replica, is then read as
// the answer to an elicitation/create (the request policy decides it as
// that) and goes upstream under the id "other" — another request of the
// upstream's than the one the runner answered. A record of the previous
// version must be read as its method, whatever that method's text; a
// record of this one must be told apart by something an upstream cannot
// write (a path or a marker of toolgate's own). Fixed: this version
// records requests at another path (pendingKey), and what it reads at the
// earlier one is a method, whatever its text.
func TestPendingAttackEarlierRecordWhoseMethodLooksLikeJSON(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	clock := time.Now()
	s := testStore(t, storage, &clock)
	rec := record("alice")
	if _, err := s.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	// What the previous version stored (HEAD's Store.ServerRequestSent:
	// storeBelow(requestKey(ref, idKey), []byte(method))) for the
	// upstream's request "up-1", relayed to the runner under that id.
	method := `{"method":"elicitation/create","id":"other"}`
	if err := storage.Store(ctx, requestKey(rec.Ref, `sup-1`), []byte(method)); err != nil {
		t.Fatal(err)
	}
	req, ok, err := s.ServerRequestAnswered(ctx, rec.Ref, `sup-1`)
	if err != nil || !ok {
		t.Fatalf("the earlier version's request is not answered: %v, %v", ok, err)
	}
	if req.Method != method || req.ID != nil {
		t.Errorf("the answer to the upstream's request %q is decided as one to %q and goes upstream under the id %s",
			method, req.Method, req.ID)
	}
}
