package mcp2026

import (
	"context"
	"sync"
	"time"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// A stateless runner's listens (subscriptions/listen) in front of an
// upstream that initializes share the implied MCP session's upstream
// session, and with it two things the upstream keeps once per session:
//
//   - Its standalone stream. An upstream may refuse a second GET stream of
//     one session (the Go SDK answers 409), and a runner changes its
//     filter by opening a new listen before closing the old one. So the
//     stream is opened by the first listen, read once, and each message
//     handed to every listen of the session, which decides and filters it
//     for its runner as its own. It stays open ListenLinger after the last
//     listen left, for the next one to take over.
//   - Its resource subscriptions. A resource is subscribed upstream by the
//     first listen that names it and unsubscribed when the last one ends.

// ListenBacklog is how many messages a listen may fall behind the shared
// stream before its own stream is ended (its runner listens again):
// a slow runner does not hold up the others.
const ListenBacklog = 64

// ListenLinger is how long an upstream standalone stream stays open after
// its last listen ended.
const ListenLinger = 2 * time.Second

// StreamOpener opens an upstream standalone stream with ctx (which ends
// when the stream is no longer listened to): next reads its messages until
// an error, and close closes it.
type StreamOpener func(ctx context.Context) (next func() (mcpmsg.Message, error), close func(), err error)

type listens struct {
	mu      sync.Mutex
	streams map[string]*sharedStream
	subs    map[string]*upstreamSubscription
}

// sharedStream is one upstream standalone stream and its listens.
type sharedStream struct {
	ready   chan struct{} // closed when the stream is open, or failed to (err)
	err     error
	stop    context.CancelFunc
	ended   bool                                              // the stream ended: no listen joins it
	members map[chan mcpmsg.Message]func(mcpmsg.Message) bool // each listen's and what it wants, under listens.mu
	idle    *time.Timer
}

// Listen joins the upstream standalone stream of key (an upstream session
// of an implied MCP session), opening it with open when none is open. The
// messages wants reports true for come on the channel (what it does not
// want does not count against the backlog), which is closed when the
// stream ends or this listen fell ListenBacklog messages behind; leave
// ends the listen. ctx bounds the wait for a stream another listen is
// opening.
func (rt *Runtime) Listen(ctx context.Context, key string, wants func(mcpmsg.Message) bool, open StreamOpener) (<-chan mcpmsg.Message, func(), error) {
	ch := make(chan mcpmsg.Message, ListenBacklog)
	l := &rt.listens
	l.mu.Lock()
	if l.streams == nil {
		l.streams = map[string]*sharedStream{}
	}
	s := l.streams[key]
	first := s == nil
	var sctx context.Context
	if first {
		s = &sharedStream{ready: make(chan struct{}), members: map[chan mcpmsg.Message]func(mcpmsg.Message) bool{}}
		sctx, s.stop = context.WithCancel(context.WithoutCancel(ctx))
		l.streams[key] = s
	}
	s.members[ch] = wants
	l.mu.Unlock()
	leave := sync.OnceFunc(func() { rt.leave(key, s, ch) })
	if !first {
		select {
		case <-s.ready:
		case <-ctx.Done():
			leave()
			return nil, nil, ctx.Err()
		}
		if s.err != nil {
			leave()
			return nil, nil, s.err
		}
		return ch, leave, nil
	}
	next, closeStream, err := open(sctx)
	if err != nil {
		s.err = err
		l.mu.Lock()
		s.ended = true
		if l.streams[key] == s {
			delete(l.streams, key)
		}
		l.mu.Unlock()
		close(s.ready)
		s.stop()
		return nil, nil, err
	}
	close(s.ready)
	go rt.relayShared(key, s, next, closeStream)
	return ch, leave, nil
}

// relayShared hands each message of s to its listens until the stream
// ends, then closes their channels.
func (rt *Runtime) relayShared(key string, s *sharedStream, next func() (mcpmsg.Message, error), closeStream func()) {
	l := &rt.listens
	defer closeStream()
	defer s.stop()
	for {
		msg, err := next()
		l.mu.Lock()
		if err != nil {
			s.ended = true
			if l.streams[key] == s {
				delete(l.streams, key)
			}
			for ch := range s.members {
				close(ch)
				delete(s.members, ch)
			}
			l.mu.Unlock()
			return
		}
		for ch, wants := range s.members {
			if !wants(msg) {
				continue
			}
			select {
			case ch <- msg:
			default: // fell behind: its stream ends, the others go on
				close(ch)
				delete(s.members, ch)
			}
		}
		l.mu.Unlock()
	}
}

// leave ends one listen of s; the stream is stopped ListenLinger after the
// last one left, unless another joined meanwhile.
func (rt *Runtime) leave(key string, s *sharedStream, ch chan mcpmsg.Message) {
	l := &rt.listens
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := s.members[ch]; ok {
		delete(s.members, ch)
		close(ch)
	}
	if len(s.members) > 0 || s.ended {
		return
	}
	if s.idle != nil {
		s.idle.Stop()
	}
	s.idle = time.AfterFunc(ListenLinger, func() {
		l.mu.Lock()
		last := len(s.members) == 0 && !s.ended
		if last {
			s.ended = true
			if l.streams[key] == s {
				delete(l.streams, key)
			}
		}
		l.mu.Unlock()
		if last {
			s.stop()
		}
	})
}

// upstreamSubscription is one resource subscribed upstream for the
// listens that name it.
type upstreamSubscription struct {
	mu sync.Mutex // held while subscribing or unsubscribing upstream
	n  int        // the listens that hold it, under listens.mu
	// undo unsubscribes the upstream: set (under mu) by the subscribe that
	// succeeded, nil while the upstream is not subscribed.
	undo func()
}

// Subscribe counts one more listen of the resource key (an upstream
// session and a URI), subscribing the upstream with subscribe when it is
// not subscribed; unsubscribe is how to undo that subscribe when the last
// listen leaves. It reports whether the upstream is subscribed; each
// Subscribe that reported true is undone by one Unsubscribe.
func (rt *Runtime) Subscribe(key string, subscribe func() bool, unsubscribe func()) bool {
	l := &rt.listens
	l.mu.Lock()
	if l.subs == nil {
		l.subs = map[string]*upstreamSubscription{}
	}
	s := l.subs[key]
	if s == nil {
		s = &upstreamSubscription{}
		l.subs[key] = s
	}
	s.n++
	l.mu.Unlock()
	s.mu.Lock()
	if s.undo == nil && subscribe() {
		s.undo = unsubscribe
	}
	live := s.undo != nil
	s.mu.Unlock()
	if !live {
		rt.Unsubscribe(key)
	}
	return live
}

// Unsubscribe ends one listen's hold of the resource key, unsubscribing
// the upstream when it was the last (whichever listen subscribed it). A
// listen that subscribes meanwhile waits for the unsubscribe and
// subscribes again, so the upstream sees them in order.
func (rt *Runtime) Unsubscribe(key string) {
	l := &rt.listens
	l.mu.Lock()
	s := l.subs[key]
	l.mu.Unlock()
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l.mu.Lock()
	s.n--
	last := s.n == 0
	l.mu.Unlock()
	if last && s.undo != nil {
		s.undo()
		s.undo = nil
	}
	l.mu.Lock()
	if s.n == 0 && l.subs[key] == s {
		delete(l.subs, key)
	}
	l.mu.Unlock()
}
