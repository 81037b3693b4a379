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
func TestTakeOverRefusesAForgottenStream(t *testing.T) {
	ended := make(chan struct{})
	close(ended) // no relay writes it: the runner dropped it
	st := &runnerStream{deadline: time.Now().Add(time.Minute), owner: func() {}, active: ended}
	st.forgotten = true // what evict did meanwhile
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := st.takeOver(ctx, nil, func() {}); !errors.Is(err, errForgotten) {
		t.Fatalf("taking over a forgotten stream: %v, want errForgotten", err)
	}
	if st.active != ended {
		t.Fatal("a refused resume became the forgotten stream's writer")
	}
}
