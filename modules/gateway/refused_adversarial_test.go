package gateway

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

// Attack (fixed): the same refused secret recorded again evicts other secrets.
// CredentialRefused (grants.go:315-316) records the refused credential
// whenever the stored one differs, with no refresh and no rate limit: a
// runner's calls in flight together all carry the cached token A; a hostile
// upstream refuses each; the first refreshes to B, every other one finds
// B != A and records A again. refusedTokens.add (refused.go:36-40) appends
// without looking for the secret, so 16 such calls fill the pair's list
// with copies of A and push out Z, a token refused a minute earlier and
// still valid at the provider, which the upstream then quotes unredacted
// in its next answer. The bound (16) was meant to span 16 refreshes, at
// least 16 minutes (refusedRefreshInterval); a burst spends it at once.
// Fixed: a secret remembered already moves to the newest end.
func TestRefusedAttackDuplicatesEvictOthers(t *testing.T) {
	var r refusedTokens
	r.add("svc", "alice", &Credential{Header: "Authorization", Value: "Bearer token-Z-refused-a-minute-ago"})
	var wg sync.WaitGroup
	for range maxRefused {
		wg.Go(func() {
			r.add("svc", "alice", &Credential{Header: "Authorization", Value: "Bearer token-A-in-flight-calls"})
		})
	}
	wg.Wait()
	got := r.of("svc", "alice")
	if !slices.Contains(got, "token-Z-refused-a-minute-ago") {
		t.Errorf("one token refused by %d calls at once evicted the earlier refused token: %d entries, %d distinct", maxRefused, len(got), len(slices.Compact(slices.Sorted(slices.Values(got)))))
	}
}

// Holds: readers and writers of refusedTokens at once (run with -race):
// a reader's slice is never written under it, and each pair stays its
// own.
func TestRefusedHoldsConcurrentReaders(t *testing.T) {
	var r refusedTokens
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 200 {
				r.add("svc", fmt.Sprintf("user-%d", i%2), &Credential{Header: "Authorization", Value: fmt.Sprintf("Bearer token-%d-%04d-xxxxxxxx", i%2, j)})
			}
		})
		wg.Go(func() {
			for range 200 {
				for _, s := range r.of("svc", fmt.Sprintf("user-%d", i%2)) {
					if s[len("token-"):len("token-")+1] != fmt.Sprint(i%2) {
						t.Errorf("user-%d sees %q", i%2, s)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if len(r.of("svc", "user-0")) != maxRefused || r.of("svc", "user-2") != nil {
		t.Fatal("bound or isolation broken")
	}
}

// Holds: App.RefusedSecrets reads the one process-wide memory only for
// the pair asked (another user's secrets are never searched in this
// user's answers, so a redaction cannot tell them apart from text).
func TestRefusedHoldsAppPerPair(t *testing.T) {
	refusedTokensOf.add("svc-adv", "mallory-adv", &Credential{Header: "Authorization", Value: "Bearer secret-of-mallory-adv"})
	a := &App{}
	if s := a.RefusedSecrets("svc-adv", "bob-adv"); s != nil {
		t.Fatalf("bob's answers are searched for %v", s)
	}
	if s := a.RefusedSecrets("svc-adv", "mallory-adv"); !slices.Contains(s, "secret-of-mallory-adv") {
		t.Fatalf("mallory's refused secret is not searched: %v", s)
	}
}
