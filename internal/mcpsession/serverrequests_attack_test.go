package mcpsession

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/internal/storetest"
)

// Attack (fixed; 997f142, forgetAnsweredElsewhere): a session at its bound asks
// the storage which of the requests it counts still wait, and forgets
// those the listing does not show. A request relayed meanwhile is counted
// (pendingRequest) before its record is stored (mcpstate.ServerRequestSent):
// the listing does not show it yet, so it is forgotten though it waits.
// Its place is then given to another request, and the session has more
// requests waiting in the storage than MaxPendingServerRequests. The prune
// should keep the requests whose record is still being written (those
// added after it started, or not yet stored), or count them again. Fixed:
// it forgets only requests stored before it listed the storage.
func TestServerRequestFixAttackPruneForgetsARequestBeingRecorded(t *testing.T) {
	base := &certmagic.FileStorage{Path: t.TempDir()}
	var armed atomic.Bool
	gate := storetest.NewGate(base, func(key string) bool { return armed.Load() && strings.Contains(key, "/pending/") })
	m, _ := replicaOf(t, gate, time.Hour, 100, 100)
	other, _ := replicaOf(t, base, time.Hour, 100, 100)
	ctx := context.Background()
	s := started(t, m, aliceSession, "up")
	elsewhere, err := other.Open(ctx, s.ID, "alice", "s")
	if err != nil {
		t.Fatal(err)
	}
	ask := func(i int) ([]byte, bool) {
		up := []byte(strconv.Itoa(i))
		id := s.ServerRequestID(firstGeneration, up)
		return id, s.ServerRequestSent(ctx, s.Upstream(), id, up, "roots/list")
	}
	var first []byte
	for i := range MaxPendingServerRequests - 1 {
		id, ok := ask(i)
		if !ok {
			t.Fatalf("request %d refused", i)
		}
		if i == 0 {
			first = id
		}
	}
	// One is answered on another replica: one place is free in storage.
	if _, ok, err := elsewhere.ServerRequestAnswered(ctx, first); !ok || err != nil {
		t.Fatalf("answering on another replica: %v, %v", ok, err)
	}
	// The last place of this replica's count goes to a request whose
	// record is being written (held at the storage's write).
	armed.Store(true)
	done := make(chan bool, 1)
	go func() { _, ok := ask(10000); done <- ok }()
	gate.Wait(t)
	// Another request, at the bound: the prune runs while the record of
	// 10000 is not yet written.
	if _, ok := ask(20000); !ok {
		t.Fatal("a request with a place freed on another replica was refused")
	}
	gate.Open()
	if !<-done {
		t.Fatal("the request being recorded was refused")
	}
	// The storage now holds MaxPendingServerRequests waiting requests: no
	// place is left.
	extra, ok := ask(30000)
	dir := filepath.Join(base.Path, "toolgate", "mcp", "sessions", s.Ref, "pending")
	entries, _ := os.ReadDir(dir)
	t.Logf("waiting in storage: %d (bound %d); one more accepted: %v", len(entries), MaxPendingServerRequests, ok)
	if ok || len(entries) > MaxPendingServerRequests {
		t.Errorf("more server requests wait than the bound: %d recorded (the last %s)", len(entries), extra)
	}
}
