package gateway

import (
	"fmt"
	"sync"
)

// Every response toolgate relays holds a goroutine, buffers and an
// upstream connection until it ends: a call waiting for its answer, an SSE
// stream. MCP sessions are bounded, but a session may open any number of
// streams, so the streams themselves are bounded too, per caller and in
// all. The count is of this process and outlives config reloads (a reload
// does not make room); each config applies its own limits to it.

// StreamLimitError reports a stream refused because the caller, or the
// gateway, has as many open as allowed.
type StreamLimitError struct {
	Option string // the option that sets the limit
	Limit  int
}

func (e *StreamLimitError) Error() string {
	return fmt.Sprintf("too many open streams (%s is %d): wait for calls in progress to finish, or close streams you do not read", e.Option, e.Limit)
}

// openStreams counts the streams of this process, in all and per caller.
var openStreams = struct {
	sync.Mutex
	all    int
	byUser map[string]int
}{byUser: make(map[string]int)}

// OpenStream counts a response relayed for user (a call in progress, an
// SSE stream) until the returned function is called. It fails with a
// *StreamLimitError, counting nothing, when user has max_streams_per_caller
// open or the gateway max_streams.
func (a *App) OpenStream(user string) (done func(), err error) {
	openStreams.Lock()
	defer openStreams.Unlock()
	switch {
	case openStreams.byUser[user] >= a.MaxStreamsPerCaller:
		return nil, &StreamLimitError{Option: "max_streams_per_caller", Limit: a.MaxStreamsPerCaller}
	case openStreams.all >= a.MaxStreams:
		return nil, &StreamLimitError{Option: "max_streams", Limit: a.MaxStreams}
	}
	openStreams.all++
	openStreams.byUser[user]++
	var once sync.Once
	return func() {
		once.Do(func() {
			openStreams.Lock()
			defer openStreams.Unlock()
			openStreams.all--
			if openStreams.byUser[user]--; openStreams.byUser[user] <= 0 {
				delete(openStreams.byUser, user)
			}
		})
	}, nil
}
