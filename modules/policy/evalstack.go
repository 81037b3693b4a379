package policy

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// Evaluations by OPA's evaluator (evaluator topdown, and policies whose
// plan cannot be run; see evaluate.go) run on a few goroutines of their
// own (evaluators) rather than on the request's goroutine. A plan's
// evaluation does not need them: it recurses only as deep as the policy's
// blocks nest.
//
// OPA's evaluator recurses deeply: evaluating the default policies takes a
// stack of tens of KiB, where a request's goroutine (net/http runs one per
// connection) starts with a few KiB, and the garbage collector halves the
// stack of every goroutine that uses a quarter of it while it waits for the
// connection's next request. So nearly every evaluation grew its
// goroutine's stack again, copying it at each doubling: in a CPU profile of
// toolgate under load, a fifth of its time was runtime.newstack under OPA's
// frames. An evaluator keeps its stack from one evaluation to the next (a
// collection halves it at most once), and there are only a few of them.
//
// The request's goroutine waits for its evaluation; evaluators are started
// as evaluations need them, up to maxEvaluators, and then evaluations wait
// for a free one. A panic in an evaluation is the evaluation's error, as it
// would have been the request's.

// maxEvaluators bounds the evaluator goroutines: more evaluations than
// processors at once only queue for the processors anyway.
var maxEvaluators = 4 * runtime.GOMAXPROCS(0)

// evalJob is one evaluation handed to an evaluator.
type evalJob struct {
	run  func()
	done chan any // receives nil, or what the evaluation panicked with
}

var (
	evalJobs   = make(chan *evalJob)
	evaluators atomic.Int32
	jobPool    = sync.Pool{New: func() any { return &evalJob{done: make(chan any, 1)} }}
)

// onEvaluator runs f on an evaluator and returns when it is done. It
// returns an error when f panicked.
func onEvaluator(f func()) error {
	j := jobPool.Get().(*evalJob)
	j.run = f
	select {
	case evalJobs <- j: // an evaluator was waiting
	default:
		if n := evaluators.Add(1); n <= int32(maxEvaluators) {
			go evaluator(j)
		} else {
			evaluators.Add(-1)
			evalJobs <- j
		}
	}
	p := <-j.done
	j.run = nil
	jobPool.Put(j)
	if p != nil {
		return fmt.Errorf("the evaluation panicked: %v", p)
	}
	return nil
}

// evaluator runs first, then every job it is handed, for as long as the
// process lives.
func evaluator(first *evalJob) {
	for j := first; ; j = <-evalJobs {
		j.done <- runJob(j.run)
	}
}

func runJob(f func()) (panicked any) {
	defer func() { panicked = recover() }()
	f()
	return nil
}
