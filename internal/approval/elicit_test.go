package approval

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/toolgate/toolgate/modules/gateway"
)

// One requester's approvals take at most maxWatchesPerRequester of the
// watched decisions: another's are still watched.
func TestWatchDecisionSharesPerRequester(t *testing.T) {
	m := &Manager{app: &gateway.App{}, waiting: map[string][]chan struct{}{}, watches: map[string]struct{}{}, watching: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ask := func(user string, i int) bool {
		a := &Approval{ID: fmt.Sprint(user, i), Requester: user, ExpiresAt: time.Now().Add(time.Hour)}
		return m.WatchDecision(ctx, a.ID, a, time.Hour, func(*Approval) {})
	}
	for i := range maxWatchesPerRequester {
		if !ask("alice", i) {
			t.Fatalf("alice's watch %d was refused", i)
		}
	}
	if ask("alice", maxWatchesPerRequester) {
		t.Error("alice has more watches than her share")
	}
	if !ask("bob", 0) {
		t.Error("bob's watch was refused while alice used her share")
	}
	cancel()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		m.mu.Lock()
		n := len(m.watching)
		m.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ended watches are still counted: %v", m.watching)
		}
	}
}
