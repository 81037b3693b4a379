package gateway

import (
	"context"
	"fmt"
	"net/http"
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
		countRefusal("max_streams_per_caller")
		return nil, &StreamLimitError{Option: "max_streams_per_caller", Limit: a.MaxStreamsPerCaller}
	case openStreams.all >= a.MaxStreams:
		countRefusal("max_streams")
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

// Runners' request bodies are held in memory from the moment they are read
// until the request is answered. One message is bounded (max_request_size);
// so are their bytes all together, per caller and in all, like streams:
// many concurrent large requests cannot exhaust the gateway's memory, and
// one caller's cannot take all of the room. The count is of this process
// and outlives config reloads; each config applies its own limits to it.

// RequestBytesLimitError reports a request refused because its caller, or
// the gateway, holds as many request bytes as allowed.
type RequestBytesLimitError struct {
	Option string // the option that sets the limit
	Limit  int64
}

func (e *RequestBytesLimitError) Error() string {
	return fmt.Sprintf("too many request bytes in flight (%s is %d): wait for calls in progress to finish, or send smaller requests", e.Option, e.Limit)
}

// heldRequestBytes counts the request bytes of this process, in all and
// per caller.
var heldRequestBytes = struct {
	sync.Mutex
	all    int64
	byUser map[string]int64
}{byUser: make(map[string]int64)}

// RequestBytes is room held for a request's body (HoldRequestBytes).
type RequestBytes struct {
	user string
	mu   sync.Mutex
	n    int64
}

// HoldRequestBytes holds room for n bytes of user's request body until
// Release. It fails with a *RequestBytesLimitError, holding nothing, when
// user's bodies or everyone's would pass max_request_bytes_in_flight_per_caller
// or max_request_bytes_in_flight.
func (a *App) HoldRequestBytes(user string, n int64) (*RequestBytes, error) {
	h := &heldRequestBytes
	h.Lock()
	defer h.Unlock()
	switch {
	case h.byUser[user]+n > a.MaxRequestBytesInFlightPerCaller:
		countRefusal("max_request_bytes_in_flight_per_caller")
		return nil, &RequestBytesLimitError{Option: "max_request_bytes_in_flight_per_caller", Limit: a.MaxRequestBytesInFlightPerCaller}
	case h.all+n > a.MaxRequestBytesInFlight:
		countRefusal("max_request_bytes_in_flight")
		return nil, &RequestBytesLimitError{Option: "max_request_bytes_in_flight", Limit: a.MaxRequestBytesInFlight}
	}
	h.all += n
	h.byUser[user] += n
	return &RequestBytes{user: user, n: n}, nil
}

// Shrink lowers the room held to n bytes (a body shorter than the room
// held for it while it was read).
func (b *RequestBytes) Shrink(n int64) {
	b.give(func(held int64) int64 { return min(held, max(n, 0)) })
}

// Release gives the room back. It may be called more than once.
func (b *RequestBytes) Release() { b.give(func(int64) int64 { return 0 }) }

func (b *RequestBytes) give(keep func(held int64) int64) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	back := b.n - keep(b.n)
	if back <= 0 {
		return
	}
	b.n -= back
	h := &heldRequestBytes
	h.Lock()
	defer h.Unlock()
	h.all -= back
	if h.byUser[b.user] -= back; h.byUser[b.user] <= 0 {
		delete(h.byUser, b.user)
	}
}

// Handover moves the room b holds to a new RequestBytes, for what keeps the
// body beyond the request (a call held between rounds): b's Release then
// gives back nothing. Nil when b holds nothing.
func (b *RequestBytes) Handover() *RequestBytes {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n == 0 {
		return nil
	}
	moved := &RequestBytes{user: b.user, n: b.n}
	b.n = 0
	return moved
}

// innerKey marks a request made inside another; its value is the outer
// request.
type innerKey struct{}

// WithOuterRequest returns ctx for a request made inside another (a
// federated message's call of a service). The outer request's body room
// covers it: reading its body holds no room again. The runner sees the
// outer request's answer, never the inner one's stream: nothing keeps
// that stream for the runner to resume. outer is the runner's request,
// whose credentials the inner one does not carry (see OuterRequest).
func WithOuterRequest(ctx context.Context, outer *http.Request) context.Context {
	return context.WithValue(ctx, innerKey{}, outer)
}

// IsInnerRequest reports whether ctx is of a request made inside another
// (WithOuterRequest).
func IsInnerRequest(ctx context.Context) bool { return OuterRequest(ctx) != nil }

// OuterRequest is the runner's request a request of ctx was made inside
// (WithOuterRequest), or nil.
func OuterRequest(ctx context.Context) *http.Request {
	outer, _ := ctx.Value(innerKey{}).(*http.Request)
	return outer
}
