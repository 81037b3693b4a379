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
//
// Replicas share MCP sessions, so the stream may be open on another
// replica than the one that sends. With a storage that tells every
// replica of changes (caddy.storage.postgres), a notification not
// delivered here is announced, and every replica delivers it to the
// session's stream if it holds one, or keeps it waiting as above: it may
// then reach a runner twice, if its stream moves between replicas that
// both kept it, which a client takes as what it is, the same news again.
// The announcement carries the notification in its key, under a digest
// of the session id; nothing is written to storage.
package notice

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/storecache"
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
	// maxAnnounced bounds a notification announced to other replicas
	// (PostgreSQL's NOTIFY takes under 8,000 bytes).
	maxAnnounced = 4096
	// prefix is where announcements go, under the storage's keys.
	prefix = "toolgate/notices/"
)

// now is time.Now, replaced in tests.
var now = time.Now

// Board holds the standalone streams open on this replica, by digest of
// their MCP session id, and the notifications waiting for one.
type Board struct {
	watch *storecache.Watch // nil: this replica alone

	mu      sync.Mutex
	streams map[string][]*stream
	waiting map[string][]waiting
}

type stream struct{ send func(msg []byte) error }

type waiting struct {
	msg   []byte
	until time.Time
}

// For returns the board of app's config, made on first use; it follows
// the other replicas' announcements while the app runs.
func For(app *gateway.App) *Board {
	v, _ := app.Shared("notice", func() (any, error) {
		b := New()
		if storage := app.Storage(); storage != nil {
			if w := storecache.NewWatch(storage, prefix); w.Notifies() {
				b.watch = w
				w.OnChange(b.announced)
				app.OnStart(func() {
					logger := app.Logger().Named("notice")
					if err := w.Start(logger); err != nil {
						logger.Warn("notifications to runners reach only streams on this replica", zap.Error(err))
						return
					}
					go func() {
						<-app.Done()
						w.Stop()
					}()
				})
			}
		}
		return b, nil
	})
	return v.(*Board)
}

// digest is the key of session in the board and in announcements.
func digest(session string) string {
	sum := sha256.Sum256([]byte(session))
	return hex.EncodeToString(sum[:16])
}

// New returns an empty board.
func New() *Board {
	return &Board{streams: map[string][]*stream{}, waiting: map[string][]waiting{}}
}

// Attach registers the standalone stream of session, which send writes to
// (safe to call from any goroutine), and delivers what waits for it. The
// stream is detached by calling the function returned, when it ends.
func (b *Board) Attach(session string, send func(msg []byte) error) (detach func()) {
	session = digest(session)
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
// session (the latest opened that takes it), or else announces it to the
// replicas (this one included), which deliver it or keep it until a
// stream opens. It reports whether msg was delivered here and now.
func (b *Board) Send(session string, msg []byte) bool {
	session = digest(session)
	if b.deliver(session, msg) {
		return true
	}
	if b.watch != nil && b.watch.Live() && len(msg) <= maxAnnounced {
		b.watch.Changed(context.Background(), prefix+session+"/"+base64.RawURLEncoding.EncodeToString(msg))
		return false
	}
	b.keep(session, msg)
	return false
}

// announced takes a notification announced by a replica: delivered to a
// stream here, or kept. It runs on the storage's listener, so delivery
// goes on without it.
func (b *Board) announced(c storecache.Change) {
	if c.Reset {
		return
	}
	session, enc, ok := strings.Cut(strings.TrimPrefix(c.Key, prefix), "/")
	msg, err := base64.RawURLEncoding.DecodeString(enc)
	if !ok || err != nil || len(session) != 32 {
		return
	}
	go func() {
		if !b.deliver(session, msg) {
			b.keep(session, msg)
		}
	}()
}

// deliver sends msg on a stream of the session with that digest, the
// latest opened that takes it.
func (b *Board) deliver(session string, msg []byte) bool {
	b.mu.Lock()
	list := append([]*stream(nil), b.streams[session]...)
	b.mu.Unlock()
	for i := len(list) - 1; i >= 0; i-- {
		if list[i].send(msg) == nil {
			return true
		}
	}
	return false
}

// keep keeps msg waiting for a stream of the session with that digest.
func (b *Board) keep(session string, msg []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queueLocked(session, []waiting{{msg: msg, until: now().Add(waitFor)}})
}

// Forget drops what waits for session, which ended.
func (b *Board) Forget(session string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.waiting, digest(session))
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
