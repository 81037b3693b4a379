package mcpbridge

import (
	"context"
	"errors"
	"io"
	"sync"
)

// errSlowReader ends a stream whose reader fell too far behind.
var errSlowReader = errors.New("the client did not read the server's messages fast enough; the stream was dropped")

// stream is the body of one SSE response to toolgate_proxy: the messages
// routed to a runner's request, or to its standalone GET stream. Messages
// are queued, never waited for, so that one runner that stops reading
// cannot hold up a connection other sessions share; a queue over its bound
// ends the stream instead.
type stream struct {
	ctx    context.Context // the proxy's request: when it ends, reading stops
	max    int64           // bound of the queued bytes
	onGone func()          // called once when the stream ends unfinished

	mu       sync.Mutex
	wake     chan struct{} // signalled when something was queued or the stream ended
	queue    [][]byte      // framed events not yet read
	queued   int64
	frame    []byte // the event being read
	finished bool   // no more messages will come
	err      error  // why reading fails, once the queue is drained
	gone     bool   // the stream ended before it finished (reader gone, or overflow)
}

func newStream(ctx context.Context, max int64, onGone func()) *stream {
	return &stream{ctx: ctx, max: max, onGone: onGone, wake: make(chan struct{}, 1)}
}

// push queues msg, one JSON-RPC message on one line, as an SSE event. It
// reports false when the stream can take no more: its reader went away,
// or fell behind by more than the bound (the stream then ends with an
// error).
func (s *stream) push(msg []byte) bool {
	framed := make([]byte, 0, len(msg)+8)
	framed = append(framed, "data: "...)
	framed = append(framed, msg...)
	framed = append(framed, '\n', '\n')
	s.mu.Lock()
	if s.finished || s.gone {
		s.mu.Unlock()
		return false
	}
	if s.queued > 0 && s.queued+int64(len(framed)) > s.max {
		s.err, s.gone, s.finished = errSlowReader, true, true
		s.queue, s.queued = nil, 0
		s.mu.Unlock()
		s.signal()
		s.goneOnce()
		return false
	}
	s.queue = append(s.queue, framed)
	s.queued += int64(len(framed))
	s.mu.Unlock()
	s.signal()
	return true
}

// finish ends the stream after the messages queued.
func (s *stream) finish() {
	s.mu.Lock()
	s.finished = true
	s.mu.Unlock()
	s.signal()
}

// open reports whether messages pushed now would be read.
func (s *stream) open() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.finished && !s.gone
}

func (s *stream) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Read implements io.Reader over the queued events.
func (s *stream) Read(p []byte) (int, error) {
	for {
		s.mu.Lock()
		if len(s.frame) == 0 && len(s.queue) > 0 {
			s.frame = s.queue[0]
			s.queue[0] = nil
			s.queue = s.queue[1:]
			s.queued -= int64(len(s.frame))
		}
		if len(s.frame) > 0 {
			n := copy(p, s.frame)
			s.frame = s.frame[n:]
			s.mu.Unlock()
			return n, nil
		}
		if s.finished {
			err := s.err
			s.mu.Unlock()
			if err == nil {
				err = io.EOF
			}
			return 0, err
		}
		s.mu.Unlock()
		select {
		case <-s.wake:
		case <-s.ctx.Done():
			s.Close()
			return 0, s.ctx.Err()
		}
	}
}

// Close implements io.Closer: the reader is gone.
func (s *stream) Close() error {
	s.mu.Lock()
	wasOpen := !s.finished && !s.gone
	s.gone, s.finished = true, true
	if s.err == nil {
		s.err = io.ErrClosedPipe
	}
	s.queue, s.queued, s.frame = nil, 0, nil
	s.mu.Unlock()
	s.signal()
	if wasOpen {
		s.goneOnce()
	}
	return nil
}

func (s *stream) goneOnce() {
	s.mu.Lock()
	f := s.onGone
	s.onGone = nil
	s.mu.Unlock()
	if f != nil {
		go f() // the pusher may hold the link's lock
	}
}
