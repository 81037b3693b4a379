package mcpsession

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

// A session keeps the secrets its upstream refused, the newest maxRefused,
// whatever adds them at once.
func TestRefusedSecrets(t *testing.T) {
	var s Session
	if s.Refused() != nil {
		t.Fatal("a new session has refused secrets")
	}
	s.AddRefused(nil)
	if s.Refused() != nil {
		t.Fatal("nothing added is something")
	}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() { s.AddRefused([]string{fmt.Sprint("token-", i)}) })
	}
	wg.Wait()
	got := s.Refused()
	if len(got) != maxRefused {
		t.Fatalf("%d secrets kept, want %d: %v", len(got), maxRefused, got)
	}
	s.AddRefused([]string{"newest-a", "newest-b"})
	got = s.Refused()
	if len(got) != maxRefused || !slices.Equal(got[maxRefused-2:], []string{"newest-a", "newest-b"}) {
		t.Fatalf("the newest are not kept last: %v", got)
	}
}
