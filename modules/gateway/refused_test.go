package gateway

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

// The secrets of refused tokens are kept per service and user, the newest
// maxRefused, whatever records them at once; a credential without a secret
// records nothing.
func TestRefusedTokens(t *testing.T) {
	var r refusedTokens
	if r.of("svc", "alice") != nil {
		t.Fatal("nothing refused yet, and something remembered")
	}
	r.add("svc", "alice", &Credential{Header: "Authorization", Value: "Bearer x"}) // too short to be a secret
	if r.of("svc", "alice") != nil {
		t.Fatal("a credential without a secret was remembered")
	}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			r.add("svc", "alice", &Credential{Header: "Authorization", Value: fmt.Sprintf("Bearer token-of-alice-%02d", i)})
		})
	}
	wg.Wait()
	got := r.of("svc", "alice")
	if len(got) != maxRefused {
		t.Fatalf("%d secrets kept, want %d", len(got), maxRefused)
	}
	r.add("svc", "alice", &Credential{Header: "Authorization", Value: "Bearer the-newest-token-of-alice"})
	if got = r.of("svc", "alice"); got[len(got)-1] != "the-newest-token-of-alice" || len(got) != maxRefused {
		t.Fatalf("the newest is not kept last: %v", got)
	}
	if r.of("svc", "bob") != nil || r.of("other", "alice") != nil {
		t.Fatal("another user's or service's pair shares alice's secrets")
	}
	if slices.Contains(r.of("svc", "alice"), "Bearer the-newest-token-of-alice") {
		t.Fatal("the scheme is kept with the token")
	}
}
