package mcpproxy

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/mcpsession"
	"github.com/toolgate/toolgate/modules/gateway"
)

// A resume finds its stream, and before it takes the stream over, newer
// dropped streams push it out of its session (forgotten: its room given
// back, its call cancelled upstream). The resume must not write a stream
// nothing holds any more.
func TestTakeOverRefusesAnEvictedStream(t *testing.T) {
	ended := make(chan struct{})
	close(ended) // no relay writes it: the runner dropped it
	st := &runnerStream{deadline: time.Now().Add(time.Minute), owner: func() {}, active: ended}
	st.evicted, st.forgotten = true, true // what evict did meanwhile
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := st.takeOver(ctx, nil, func() {}); !errors.Is(err, errEvicted) {
		t.Fatalf("taking over an evicted stream: %v, want errEvicted", err)
	}
	if st.active != ended {
		t.Fatal("a refused resume became the evicted stream's writer")
	}
}

// A resume takes a stream over the moment the relay writing it ends, and
// that relay records the stream dropped as it ends. Were it recorded after
// the resume recorded the stream written again, the stream being resumed
// would count among the session's dropped ones, and eight newer dropped
// streams would push it out and cancel its call (seen under load as
// TestResume2HoldsStreamBeingResumedIsNotPushedOut failing). Each round
// races a relay's end with a resume taking its stream over, then drops
// MaxResumableStreams newer streams: none may push the resumed one out.
// The window was a few instructions wide: with a runtime.Gosched() after
// release's unlock, the code before the fix failed here in round 0.
func TestResumedStreamIsNeverCountedDropped(t *testing.T) {
	_, ms := localSession(t)
	call := &gateway.Call{MCPSession: ms}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := func() *runnerStream {
		st := newRunnerStream(call, gateway.Upstream{}, time.Now().Add(time.Minute), &sseWriter{}, func() {}, func(string) {})
		st.id("1") // kept in the session at its first event id
		return st
	}
	for round := range 300 {
		st := stream()
		st.owner = func() { go st.release("") } // the relay a resume stops ends, and releases the stream
		if err := st.takeOver(ctx, &sseWriter{}, func() {}); err != nil {
			t.Fatalf("round %d: taking over: %v", round, err)
		}
		for range mcpsession.MaxResumableStreams {
			newer := stream()
			newer.release("")
		}
		st.mu.Lock()
		evicted := st.evicted
		st.mu.Unlock()
		if evicted {
			t.Fatalf("round %d: the stream a resume writes was pushed out of its session by %d newer dropped ones", round, mcpsession.MaxResumableStreams)
		}
		st.release("")
		st.forget("")
	}
}
