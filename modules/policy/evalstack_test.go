package policy

import (
	"strings"
	"sync"
	"testing"
)

// A panic in an evaluation is that evaluation's error; the evaluator
// survives it and takes the next one.
func TestEvaluationPanicIsAnError(t *testing.T) {
	err := onEvaluator(func() { panic("boom") })
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("a panicking evaluation returned %v", err)
	}
	ran := false
	if err := onEvaluator(func() { ran = true }); err != nil || !ran {
		t.Fatalf("the next evaluation: ran %v, %v", ran, err)
	}
}

// Evaluations run on at most maxEvaluators goroutines, however many wait:
// the rest queue for a free one, and every one runs.
func TestEvaluatorsAreBounded(t *testing.T) {
	n := 3 * maxEvaluators
	release := make(chan struct{})
	var started sync.WaitGroup
	var once sync.Once
	var mu sync.Mutex
	running, most, done := 0, 0, 0
	var wg sync.WaitGroup
	started.Add(1)
	for i := range n {
		wg.Go(func() {
			if err := onEvaluator(func() {
				mu.Lock()
				running++
				most = max(most, running)
				if running == maxEvaluators {
					once.Do(started.Done)
				}
				mu.Unlock()
				<-release
				mu.Lock()
				running--
				done++
				mu.Unlock()
			}); err != nil {
				t.Errorf("evaluation %d: %v", i, err)
			}
		})
	}
	started.Wait() // every evaluator is busy, the other evaluations wait
	close(release)
	wg.Wait()
	if most != maxEvaluators || done != n || int(evaluators.Load()) > maxEvaluators {
		t.Errorf("%d evaluations ran, at most %d at once on %d evaluators; want %d, at most %d", done, most, evaluators.Load(), n, maxEvaluators)
	}
}
