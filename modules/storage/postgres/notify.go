package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// Change is one notification delivered to a subscriber.
type Change struct {
	// Key is the key that changed, as published (cleaned like a storage
	// key). It is empty when Reset is set.
	Key string
	// Local reports that this process published the change.
	Local bool
	// Reset reports that changes may have been missed: the listening
	// connection was (re)established. Treat everything under the prefix
	// as changed.
	Reset bool
	// Lost (with Reset) reports that the listening connection was lost:
	// changes are missed until the next Reset without it, which comes
	// once it is back. Copies of what is stored are then to be trusted
	// only for a time, as with a storage that announces nothing.
	Lost bool
}

// Notification payloads are "<kind> <origin> <key or lock name>".
const (
	kindKey  = "k"
	kindLock = "l"
)

func payload(kind, origin, key string) string { return kind + " " + origin + " " + key }

// listenerPing is how long the listener waits for a notification before
// it checks that its connection is still alive.
var listenerPing = 30 * time.Second

// Publish announces that key changed to every subscriber of the table in
// every process using the same database, this one included, through
// PostgreSQL's NOTIFY. Call it after the change is stored: notifications
// are delivered only after the publishing transaction commits, and a
// subscriber that reloads on a notification sees the change. key "" means
// everything.
func (s *Storage) Publish(ctx context.Context, key string) error {
	k, err := s.key("publishing", key, true)
	if err != nil {
		return err
	}
	err = s.db.do(ctx, func(ctx context.Context) error {
		_, err := s.db.pool.Exec(ctx, "select pg_notify($1, $2)", s.t.channel, payload(kindKey, s.db.origin, k))
		return err
	})
	return wrapErr(fmt.Sprintf("publishing %q", k), err)
}

// Subscribe calls fn for every published change of a key under prefix
// (prefix itself, or keys below it as a directory; "" is every key). The
// first call is a Reset, made once the subscription is listening (at once
// when the pool already listens on the table's channel): from then on no
// change is missed without another Reset, which comes whenever the
// listening connection was lost and is back. fn runs on the listener's
// goroutine, one call at a time, in the order PostgreSQL delivered the
// notifications: it must return quickly (drop a cache entry, signal a
// channel). Subscribe does not wait for the database; call the returned
// function to stop.
func (s *Storage) Subscribe(prefix string, fn func(Change)) (unsubscribe func(), err error) {
	p, err := s.key("subscribing", prefix, true)
	if err != nil {
		return nil, err
	}
	return s.db.getListener().subscribe(s.t.channel, p, fn), nil
}

// listener holds one connection per database that LISTENs on the channels
// of its tables, reconnecting with backoff after failures, and dispatches
// notifications to subscribers and lock waiters.
type listener struct {
	db     *database
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	channels map[string]*channelSubs
	// interrupt ends the current wait, so that the loop LISTENs on a
	// channel added meanwhile and resets new subscribers.
	interrupt context.CancelFunc
}

type channelSubs struct {
	subs    map[*subscription]struct{}
	waiters map[string]map[chan struct{}]struct{} // lock name → waiting Lock calls
}

type subscription struct {
	prefix string
	fn     func(Change)
	// pending: fn has yet to get the Reset that says it is listening.
	pending bool
}

func newListener(db *database) *listener {
	ctx, cancel := context.WithCancel(context.Background())
	return &listener{db: db, ctx: ctx, cancel: cancel, done: make(chan struct{}), channels: make(map[string]*channelSubs)}
}

func (l *listener) start() { go l.run() }

func (l *listener) stop() {
	l.cancel()
	select {
	case <-l.done:
	case <-time.After(10 * time.Second):
		l.db.logger.Warn("storage notification listener did not stop within 10s")
	}
}

// channel returns the subscribers of ch, creating them (and waking the
// loop to LISTEN) on first use. l.mu is held.
func (l *listener) channel(ch string) *channelSubs {
	c := l.channels[ch]
	if c == nil {
		c = &channelSubs{subs: make(map[*subscription]struct{}), waiters: make(map[string]map[chan struct{}]struct{})}
		l.channels[ch] = c
		if l.interrupt != nil {
			l.interrupt()
		}
	}
	return c
}

func (l *listener) subscribe(ch, prefix string, fn func(Change)) func() {
	sub := &subscription{prefix: prefix, fn: fn, pending: true}
	l.mu.Lock()
	l.channel(ch).subs[sub] = struct{}{}
	if l.interrupt != nil {
		l.interrupt()
	}
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		delete(l.channels[ch].subs, sub)
		l.mu.Unlock()
	}
}

// watchLock returns a channel that receives when the lock name of channel
// ch is released (or notifications may have been missed).
func (l *listener) watchLock(ch, name string) (<-chan struct{}, func()) {
	w := make(chan struct{}, 1)
	l.mu.Lock()
	c := l.channel(ch)
	if c.waiters[name] == nil {
		c.waiters[name] = make(map[chan struct{}]struct{})
	}
	c.waiters[name][w] = struct{}{}
	l.mu.Unlock()
	return w, func() {
		l.mu.Lock()
		delete(c.waiters[name], w)
		if len(c.waiters[name]) == 0 {
			delete(c.waiters, name)
		}
		l.mu.Unlock()
	}
}

func (l *listener) run() {
	defer close(l.done)
	backoff := 100 * time.Millisecond
	failing := false
	for l.ctx.Err() == nil {
		err := l.session(func() { backoff, failing = 100*time.Millisecond, false })
		if l.ctx.Err() != nil {
			return
		}
		l.lost()
		if !failing {
			l.db.logger.Warn("storage notification listener disconnected; reconnecting",
				zap.Error(wrapErr("listening", err)))
			failing = true
		} else {
			l.db.logger.Debug("storage notification listener still disconnected",
				zap.Error(wrapErr("listening", err)))
		}
		select {
		case <-l.ctx.Done():
			return
		case <-time.After(jitter(backoff)):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// session connects, LISTENs and dispatches until the connection fails or
// the listener stops; connected runs once it listens.
func (l *listener) session(connected func()) error {
	cfg := l.db.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = "toolgate listener"
	ctx, cancel := context.WithTimeout(l.ctx, 10*time.Second)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	listening := make(map[string]bool)
	first := true
	for {
		// LISTEN on every channel not yet listened to, then tell its
		// subscribers that they may have missed changes until now
		l.mu.Lock()
		var fresh []string
		for ch := range l.channels {
			if !listening[ch] {
				fresh = append(fresh, ch)
			}
		}
		waitCtx, interrupt := context.WithTimeout(l.ctx, listenerPing)
		l.interrupt = interrupt
		l.mu.Unlock()
		for _, ch := range fresh {
			if _, err := conn.Exec(l.ctx, "listen "+pgx.Identifier{ch}.Sanitize()); err != nil {
				interrupt()
				return err
			}
			listening[ch] = true
		}
		if first {
			first = false
			connected()
			l.db.logger.Debug("storage notification listener connected")
		}
		l.reset(listening, fresh)

		n, err := conn.WaitForNotification(waitCtx)
		timedOut := waitCtx.Err() != nil
		interrupt()
		if l.ctx.Err() != nil {
			return l.ctx.Err()
		}
		if err != nil {
			if !timedOut || conn.IsClosed() {
				return err
			}
			if errors.Is(waitCtx.Err(), context.DeadlineExceeded) {
				pingCtx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
				err := conn.Ping(pingCtx)
				cancel()
				if err != nil {
					return err
				}
			}
			continue
		}
		l.dispatch(n.Channel, n.Payload)
	}
}

// lost tells the subscribers that had their Reset that the listening
// connection is gone (Change.Lost): until it is back, a copy that an
// announcement would have withdrawn is not known to be stale. (A
// connection that cannot be made again, while the pool still reaches
// the database — new connections refused at max_connections, a pooler
// at its limit —, would otherwise leave them trusting their copies for
// as long as it lasts.) Lock waiters are woken to look again. Each
// subscriber gets its Reset again once the connection is back.
func (l *listener) lost() {
	l.mu.Lock()
	var fns []func(Change)
	for _, c := range l.channels {
		for sub := range c.subs {
			if !sub.pending {
				sub.pending = true
				fns = append(fns, sub.fn)
			}
		}
		for _, ws := range c.waiters {
			for w := range ws {
				signal(w)
			}
		}
	}
	l.mu.Unlock()
	for _, fn := range fns {
		fn(Change{Reset: true, Lost: true})
	}
}

// reset tells the subscribers and lock waiters of the fresh channels
// (just listened to) that notifications may have been missed, and gives
// every new subscriber of a listened channel its first Reset.
func (l *listener) reset(listening map[string]bool, fresh []string) {
	l.mu.Lock()
	for _, ch := range fresh {
		c := l.channels[ch]
		for sub := range c.subs {
			sub.pending = true
		}
		for _, ws := range c.waiters {
			for w := range ws {
				signal(w)
			}
		}
	}
	var fns []func(Change)
	for ch := range listening {
		for sub := range l.channels[ch].subs {
			if sub.pending {
				sub.pending = false
				fns = append(fns, sub.fn)
			}
		}
	}
	l.mu.Unlock()
	for _, fn := range fns {
		fn(Change{Reset: true})
	}
}

func (l *listener) dispatch(ch, msg string) {
	kind, rest, ok1 := strings.Cut(msg, " ")
	origin, key, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 {
		l.db.logger.Debug("ignoring a malformed storage notification", zap.String("channel", ch))
		return
	}
	change := Change{Key: key, Local: origin == l.db.origin}
	l.mu.Lock()
	c := l.channels[ch]
	var fns []func(Change)
	if c != nil {
		switch kind {
		case kindKey:
			for sub := range c.subs {
				if under(key, sub.prefix) {
					fns = append(fns, sub.fn)
				}
			}
		case kindLock:
			for w := range c.waiters[key] {
				signal(w)
			}
		}
	}
	l.mu.Unlock()
	for _, fn := range fns {
		fn(change)
	}
}

// under reports whether key is prefix or below it; a published "" (every
// key) concerns every subscriber.
func under(key, prefix string) bool {
	return prefix == "" || key == "" || key == prefix || strings.HasPrefix(key, prefix+"/")
}

func signal(w chan struct{}) {
	select {
	case w <- struct{}{}:
	default:
	}
}
