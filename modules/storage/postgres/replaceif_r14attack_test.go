package postgres

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"testing"
	"time"
)

// Attack: real concurrency on ReplaceIfValue, as replicas of the gateway
// make it (storeSealed: a save's store over what it read; undoSealed: a
// put-back): in each round, six writers on two pools (two processes)
// replace the same old value at once, while (every third round) a Delete
// (a disconnect) and a Store (another save's fallback) race them.
//
// Expected and Held: at most one ReplaceIfValue of the old value succeeds
// (exactly one when no Delete or Store came first), and what is stored at
// the end is that writer's value, the Store's, or nothing after the
// Delete; a ReplaceIfValue never creates a key a Delete removed, and none
// fails. Severity: none.
func TestR14ReplaceIfValueRealConcurrency(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	table := newTableName()
	s1 := newStorage(t, sharedDSN(t, "r14-cas-1"), table, 0)
	s2 := newStorage(t, sharedDSN(t, "r14-cas-2"), table, 0)
	const key = "toolgate/connections/personal/alice"
	for round := range 30 {
		old := []byte(fmt.Sprintf("old-%d", round))
		mustStore(t, ctx, s1, key, old)
		racing := round%3 == 0
		var wg sync.WaitGroup
		var mu sync.Mutex
		var won []string
		start := make(chan struct{})
		for w := range 6 {
			s := s1
			if w%2 == 1 {
				s = s2
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				v := fmt.Sprintf("w%d-%d", w, round)
				ok, err := s.ReplaceIfValue(ctx, key, old, []byte(v))
				if err != nil {
					t.Errorf("round %d: ReplaceIfValue: %v", round, err)
				}
				if ok {
					mu.Lock()
					won = append(won, v)
					mu.Unlock()
				}
			}()
		}
		var deleted, stored bool
		if racing {
			wg.Add(2)
			go func() {
				defer wg.Done()
				<-start
				if err := s2.Delete(ctx, key); err != nil {
					t.Errorf("round %d: Delete: %v", round, err)
				}
				mu.Lock()
				deleted = true
				mu.Unlock()
			}()
			go func() {
				defer wg.Done()
				<-start
				if err := s1.Store(ctx, key, []byte(fmt.Sprintf("store-%d", round))); err != nil {
					t.Errorf("round %d: Store: %v", round, err)
				}
				mu.Lock()
				stored = true
				mu.Unlock()
			}()
		}
		close(start)
		wg.Wait()
		if t.Failed() {
			return
		}
		got, err := s1.Load(ctx, key)
		switch {
		case len(won) > 1:
			t.Fatalf("round %d: %d writers replaced the same old value: %q", round, len(won), won)
		case !racing && len(won) != 1:
			t.Fatalf("round %d: no writer replaced the old value: %q", round, won)
		case racing && errors.Is(err, fs.ErrNotExist):
			// the Delete came last (or first: then nothing was replaced)
		case err != nil:
			t.Fatalf("round %d: Load: %v", round, err)
		case racing && string(got) == fmt.Sprintf("store-%d", round):
			// the Store came last
		case len(won) == 1 && string(got) != won[0]:
			t.Fatalf("round %d: %q stored, %q replaced it", round, got, won[0])
		case len(won) == 0:
			t.Fatalf("round %d: %q stored though no writer replaced (Delete %v, Store %v)", round, got, deleted, stored)
		}
	}
}
