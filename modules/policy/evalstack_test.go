package policy

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
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

// An evaluation by OPA's evaluator that waits for a free evaluator (all of
// them busy with others' evaluations) has its whole deadline once it
// starts: one caller's slow evaluations must not make another's time out
// and be denied.
func TestWaitingForAnEvaluatorIsNotTheDeadline(t *testing.T) {
	e := benchEngineWith(t, "data.toolgate.request.decision", stageRequest, evaluatorTopdown)
	release := make(chan struct{})
	var busy, wg sync.WaitGroup
	busy.Add(maxEvaluators)
	for range maxEvaluators {
		wg.Go(func() {
			_ = onEvaluator(func() { busy.Done(); <-release })
		})
	}
	busy.Wait() // every evaluator is taken
	decided := make(chan outcome, 1)
	go func() {
		input := ast.MustParseTerm(`{"method": "initialize", "caller": {"user": "bob", "groups": []}, "service": {"id": "svc"}}`).Value
		decided <- e.decideWith(context.Background(), e.current.Load(), input, 50*time.Millisecond, "arguments")
	}()
	time.Sleep(200 * time.Millisecond) // longer than bob's deadline, waiting
	close(release)
	wg.Wait()
	if o := <-decided; strings.Contains(o.Reason, "deadline") {
		t.Errorf("an evaluation that waited for an evaluator was denied as a timeout: %+v", o)
	}
}
