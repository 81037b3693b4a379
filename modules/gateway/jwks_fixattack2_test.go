package gateway

import (
	"testing"
	"time"
)

// Attack: the issuer retires key k1 (its set now holds k2 only). The
// gateway's set is refetched once it is 15 minutes old, but that one
// refetch fails (a blip: the IdP answers 500 once). keySet.lookup says "a
// fetch that fails leaves the set as it was, and is tried again a minute
// later"; but startFetch stamps lastFetch when a fetch starts, so the
// failed attempt makes the set "fresh" again: no refetch is tried before
// it is 10 minutes old once more, and tokens signed with the retired k1
// keep verifying for those 10 minutes (up to 25 minutes after the set
// was fetched, not 15). Two minutes after the failed attempt, the IdP
// answering again, a token of k1 should be refused.
func TestFixAttack2FailedJWKSRefetchNotRetriedAMinuteLater(t *testing.T) {
	clock, srv, k1, k2, auth := jwksOfTwoKeys(t)
	if err := auth(k1); err != nil {
		t.Fatal(err)
	}
	// The issuer retires k1; the refetch at 16 minutes meets a blip.
	srv.mu.Lock()
	srv.status = 500
	srv.keys = []signingKey{k2}
	srv.mu.Unlock()
	*clock = clock.Add(16 * time.Minute)
	_ = auth(k1)
	if n := srv.fetches.Load(); n != 2 {
		t.Fatalf("control: %d fetches, want 2 (start and the failed refetch)", n)
	}
	// The IdP answers again.
	srv.mu.Lock()
	srv.status = 200
	srv.mu.Unlock()
	*clock = clock.Add(2 * time.Minute)
	err := auth(k1)
	if n := srv.fetches.Load(); n < 3 {
		t.Errorf("2 minutes after a failed refetch of a 16-minute-old set, no refetch tried (%d fetches); the set's 16-minute-old keys still trusted", n)
	}
	if err == nil {
		t.Error("18 minutes after the set was fetched, and 2 after a failed refetch, a token of the key the issuer retired still verifies")
	}
	// It stays trusted until the set counts as 10 minutes old again.
	*clock = clock.Add(7 * time.Minute)
	if auth(k1) == nil {
		t.Error("25 minutes after the set was fetched, a token of the retired key still verifies")
	}
}
