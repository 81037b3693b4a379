// Package notice carries toolgate's own notifications to runners on the
// standalone stream of their MCP session: the one stream the protocol
// keeps for a server to speak unasked. An approval decided for a runner
// that was told to open its page (-32042, URL elicitation) is such a
// notification; it belongs to no request, so no request's stream may
// carry it.
//
// The proxy attaches each standalone stream it relays to the board; other
// capabilities send to a session. A notification for a session with no
// stream open on this replica waits, a few per session and for a while,
// for one to open: a client opens its stream after initializing, and
// reopens it when it drops.
package notice

import (
	"sync"
	"time"

	"github.com/toolgate/toolgate/modules/gateway"
)

const (
	// maxWaiting is how many notifications wait per session.
	maxWaiting = 8
	// maxSessions is how many sessions may have notifications waiting
	// (a few MiB at most).
	maxSessions = 16384
	// waitFor is how long a notification waits for a stream.
	waitFor = 5 * time.Minute
)

// now is time.Now, replaced in tests.
var now = time.Now

// Board holds the standalone streams open on this replica, by MCP session
// id, and the notifications waiting for one.
type Board struct {
	mu      sync.Mutex
	streams map[string][]*stream
	waiting map[string][]waiting
}

type stream struct{ send func(msg []byte) error }

type waiting struct {
	msg   []byte
	until time.Time
}

// For returns the board of app's config, made on first use.
func For(app *gateway.App) *Board {
	v, _ := app.Shared("notice", func() (any, error) { return New(), nil })
	return v.(*Board)
}

// New returns an empty board.
func New() *Board {
	return &Board{streams: map[string][]*stream{}, waiting: map[string][]waiting{}}
}

// Attach registers the standalone stream of session, which send writes to
// (safe to call from any goroutine), and delivers what waits for it. The
// stream is detached by calling the function returned, when it ends.
func (b *Board) Attach(session string, send func(msg []byte) error) (detach func()) {
	s := &stream{send: send}
	b.mu.Lock()
	b.streams[session] = append(b.streams[session], s)
	queued := b.waiting[session]
	delete(b.waiting, session)
	b.mu.Unlock()
	t := now()
	for i, w := range queued {
		if t.After(w.until) {
			continue
		}
		if send(w.msg) != nil {
			b.mu.Lock()
			b.queueLocked(session, queued[i:]) // the stream broke: the rest waits for the next
			b.mu.Unlock()
			break
		}
	}
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		list := b.streams[session]
		for i, o := range list {
			if o == s {
				list = append(list[:i:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(b.streams, session)
		} else {
			b.streams[session] = list
		}
	}
}

// Send delivers msg, a JSON-RPC notification, on one standalone stream of
// session (the latest opened that takes it), or keeps it until one opens.
// It reports whether msg was delivered now.
func (b *Board) Send(session string, msg []byte) bool {
	b.mu.Lock()
	list := append([]*stream(nil), b.streams[session]...)
	b.mu.Unlock()
	for i := len(list) - 1; i >= 0; i-- {
		if list[i].send(msg) == nil {
			return true
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queueLocked(session, []waiting{{msg: msg, until: now().Add(waitFor)}})
	return false
}

// Forget drops what waits for session, which ended.
func (b *Board) Forget(session string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.waiting, session)
}

// queueLocked keeps ws waiting for session, within the bounds: the
// oldest of a session go first, and past maxSessions nothing new waits.
func (b *Board) queueLocked(session string, ws []waiting) {
	if _, ok := b.waiting[session]; !ok && len(b.waiting) >= maxSessions {
		b.pruneLocked()
		if len(b.waiting) >= maxSessions {
			return
		}
	}
	q := append(b.waiting[session], ws...)
	if len(q) > maxWaiting {
		q = q[len(q)-maxWaiting:]
	}
	b.waiting[session] = q
}

// pruneLocked drops the notifications that waited too long.
func (b *Board) pruneLocked() {
	t := now()
	for s, q := range b.waiting {
		kept := q[:0]
		for _, w := range q {
			if !t.After(w.until) {
				kept = append(kept, w)
			}
		}
		if len(kept) == 0 {
			delete(b.waiting, s)
		} else {
			b.waiting[s] = kept
		}
	}
}
