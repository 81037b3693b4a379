package mcpsession

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// Attack (fixed): a caller at max_mcp_sessions_per_caller opens any number of MCP
// sessions by sending their initializes at once: create counts the
// sessions stored (CountUser) plus local ones, but a stored session is
// written only by SetUpstream, after the upstream answered the
// initialize, and nothing is held in between — so every initialize in
// flight sees the same count, and SetUpstream stores them all without
// counting again. (The storage here is the plain FileStorage:
// modules/gateway imports this package, so its SafeListing is out of
// reach of an internal test; the listing is not what this is about.)
// Fixed: create reserves the caller's slot in storage under the caller's
// storage lock (counted with the stored sessions), and SetUpstream stores
// the session and drops the reservation under the same lock.
func TestRacePerCallerLimitPassedByInitializesInFlight(t *testing.T) {
	const perCaller = 2
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	a, _ := replicaOf(t, storage, time.Hour, 100, perCaller) // replica A
	ctx := context.Background()
	var inFlight []*Session
	for range 5 { // five initializes, their upstream answers not back yet
		s, err := a.Create(ctx, aliceSession.User, aliceSession.ID, aliceSession.ExpiresAt, "svc")
		if err != nil {
			break
		}
		inFlight = append(inFlight, s)
	}
	stored := 0
	for i, s := range inFlight { // the upstream answers
		up := Upstream{SessionID: fmt.Sprint("up-", i), ProtocolVersion: "2025-11-25", InitializeParams: []byte(`{}`)}
		if err := s.SetUpstream(ctx, up); err == nil {
			stored++
		}
	}
	n, err := a.cfg().State.CountUser(ctx, aliceSession.User, 100)
	if err != nil {
		t.Fatal(err)
	}
	if stored > perCaller {
		t.Errorf("alice holds %d stored MCP sessions (CountUser %d) under max_mcp_sessions_per_caller %d", stored, n, perCaller)
	}
}
