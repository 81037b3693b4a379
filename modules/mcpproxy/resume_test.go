package mcpproxy

import (
	"context"
	"errors"
	"testing"
	"time"
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
