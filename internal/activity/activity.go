// Package activity keeps a bounded record of recent policy decisions in
// the gateway's storage, for people to look at (the console's Activity
// page): what was decided for them, and for administrators, for everyone.
// The audit log stays the authoritative record; this one is queryable, and
// shared by every replica that shares the storage.
//
// Decisions are handed over on the call path without blocking and written
// in batches by one goroutine, which a decision does not wake: it drains
// the queue once a second, or as soon as a batch is waiting (waking a
// parked goroutine for each decision cost the call path a system call and
// the process tens of microseconds of CPU per decision). Each flush
// stores, per user, one object holding that user's new decisions, under a
// key that starts with the flush time, so that listing a user's keys lists
// their decisions in time order without reading them. Retention is by age
// and by count per user. Should decisions arrive faster than storage takes
// them, the excess is dropped rather than slowing a call, and the writer
// logs how many.
//
// A reload stops the replaced configuration's log while calls that began
// on it are still running (Caddy lets them finish): what they decide after
// that is handed to the newest running log, so that no decision of a call
// that straddles a reload is missing from the record.
package activity

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/gateway"
)

// now is the clock; tests replace it.
var now = time.Now

const (
	prefix        = "toolgate/activity"
	queueSize     = 4096
	batchSize     = 256
	flushInterval = time.Second
)

// Log is the recent-decisions record. It is a gateway.DecisionRecorder.
type Log struct {
	storage   certmagic.Storage
	retention time.Duration
	perUser   int // objects kept per user
	logger    *zap.Logger

	queue    chan gateway.DecisionRecord
	full     chan struct{} // a batch is waiting (capacity 1)
	dropped  atomic.Int64
	reported int64         // the dropped decisions the writer has logged
	every    time.Duration // how often the queue is drained when no batch fills it

	// mu orders decisions against Stop: a decision is queued before the
	// last drain or handed on, never left in a stopped log's queue.
	mu      sync.RWMutex
	stopped bool

	startOnce sync.Once
	started   atomic.Bool
	stopOnce  sync.Once
	stop      chan struct{}
	done      chan struct{}
}

// New returns a log over storage that keeps decisions for retention and at
// most perUser flushes' worth per user. Start begins writing.
func New(storage certmagic.Storage, retention time.Duration, perUser int, logger *zap.Logger) *Log {
	return &Log{storage: storage, retention: retention, perUser: perUser, logger: logger,
		queue: make(chan gateway.DecisionRecord, queueSize), full: make(chan struct{}, 1), every: flushInterval,
		stop: make(chan struct{}), done: make(chan struct{})}
}

// newest is the log started last in this process (that of the running
// configuration), nil once it stopped.
var newest atomic.Pointer[Log]

// RecordDecision queues d for the next flush. It never blocks, and wakes
// the writer only when a batch is waiting. Once l stopped, d goes to the
// newest running log.
func (l *Log) RecordDecision(d gateway.DecisionRecord) {
	d.Method, d.Tool, d.Reason = cut(d.Method, maxName), cut(d.Tool, maxName), cut(d.Reason, maxReason)
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.stopped {
		if next := newest.Load(); next != nil && next != l {
			next.RecordDecision(d)
		} else {
			l.dropped.Add(1) // nothing records any more; the audit log has it
		}
		return
	}
	select {
	case l.queue <- d:
		if len(l.queue) >= batchSize {
			select {
			case l.full <- struct{}{}:
			default: // signalled already
			}
		}
	default:
		l.dropped.Add(1)
	}
}

// Dropped is how many decisions were not recorded because the queue was
// full.
func (l *Log) Dropped() int64 { return l.dropped.Load() }

// Start begins writing queued decisions, once, and makes l the log that
// stopped ones hand decisions to.
func (l *Log) Start() {
	l.startOnce.Do(func() {
		l.started.Store(true)
		newest.Store(l)
		go l.run()
	})
}

// Stop writes what is queued and stops; decisions that arrive later go to
// the newest running log. Without Start it writes nothing.
func (l *Log) Stop() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	newest.CompareAndSwap(l, nil)
	l.stopOnce.Do(func() { close(l.stop) })
	l.startOnce.Do(func() {}) // a Start after Stop starts nothing
	if l.started.Load() {
		<-l.done
	}
}

func (l *Log) run() {
	defer close(l.done)
	tick := time.NewTicker(l.every)
	defer tick.Stop()
	sweep := time.NewTicker(15 * time.Minute)
	defer sweep.Stop()
	batch := make([]gateway.DecisionRecord, 0, batchSize)
	for {
		select {
		case <-l.full:
		case <-tick.C:
		case <-sweep.C:
			if n, err := l.Sweep(context.Background()); err != nil {
				l.logger.Warn("sweeping the activity record", zap.Error(err))
			} else if n > 0 {
				l.logger.Debug("swept the activity record", zap.Int("objects", n))
			}
			continue
		case <-l.stop:
			l.drain(batch)
			return
		}
		l.drain(batch)
	}
}

// drain flushes what is queued, a batch at a time, into batch's memory,
// and logs the decisions dropped since the last drain. What arrives
// meanwhile waits for the next drain, so that a stop is heard even while
// decisions keep coming.
func (l *Log) drain(batch []gateway.DecisionRecord) {
	for left := len(l.queue); left > 0; left -= len(batch) {
		batch = batch[:0]
	take:
		for len(batch) < min(batchSize, left) {
			select {
			case d := <-l.queue:
				batch = append(batch, d)
			default:
				break take
			}
		}
		if len(batch) == 0 {
			break
		}
		l.Flush(context.Background(), batch)
		clear(batch) // keeps no user's decisions until the next flush
	}
	if n := l.dropped.Load(); n > l.reported {
		l.logger.Warn("decisions arrived faster than the activity record stores them; those dropped are in the audit log only",
			zap.Int64("dropped", n-l.reported), zap.Int64("dropped_total", n))
		l.reported = n
	}
}

// Bounds of what a decision's record keeps of the runner's method and
// tool names (which a runner chooses, up to max_request_size) and of the
// policy's reason: the record and its page are read by people, and the
// audit log keeps the rest.
const (
	maxName   = 256
	maxReason = 1024
)

// cut is text cut to at most max bytes on a character boundary, marked
// with an ellipsis and the size it had.
func cut(text string, max int) string {
	if len(text) <= max {
		return text
	}
	end := max
	for end > 0 && !utf8.RuneStart(text[end]) {
		end--
	}
	return fmt.Sprintf("%s… (%d bytes)", text[:end], len(text))
}

// Flush stores batch: one object per user. A failure is logged; those
// decisions stay in the audit log only.
func (l *Log) Flush(ctx context.Context, batch []gateway.DecisionRecord) {
	byUser := map[string][]gateway.DecisionRecord{}
	for _, d := range batch {
		byUser[d.User] = append(byUser[d.User], d)
	}
	stamp := fmt.Sprintf("%020d", now().UnixNano())
	for user, records := range byUser {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false) // a name of '<' is one byte, not six
		if err := enc.Encode(records); err != nil {
			continue
		}
		data := buf.Bytes()
		var r [6]byte
		_, _ = rand.Read(r[:])
		key := path.Join(userPrefix(user), stamp+"-"+hex.EncodeToString(r[:]))
		if err := l.storage.Store(ctx, key, data); err != nil {
			l.logger.Warn("storing decisions in the activity record failed; they are in the audit log only",
				zap.Int("decisions", len(records)), zap.Error(err))
		}
	}
}

func userPrefix(user string) string {
	sum := sha256.Sum256([]byte(user))
	return path.Join(prefix, hex.EncodeToString(sum[:]))
}

// keyTime is the flush time a key starts with.
func keyTime(key string) (time.Time, bool) {
	stamp, _, _ := strings.Cut(path.Base(key), "-")
	n, err := strconv.ParseInt(stamp, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, n), true
}

// Recent returns up to limit of user's decisions, newest first.
func (l *Log) Recent(ctx context.Context, user string, limit int) ([]gateway.DecisionRecord, error) {
	return l.recent(ctx, []string{userPrefix(user)}, limit)
}

// RecentAll returns up to limit decisions of everyone, newest first.
func (l *Log) RecentAll(ctx context.Context, limit int) ([]gateway.DecisionRecord, error) {
	users, err := l.storage.List(ctx, prefix, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the activity record: %w", err)
	}
	return l.recent(ctx, users, limit)
}

// recent reads the newest objects under the user prefixes until it has
// limit decisions (or none are left).
func (l *Log) recent(ctx context.Context, prefixes []string, limit int) ([]gateway.DecisionRecord, error) {
	var keys []string
	for _, p := range prefixes {
		ks, err := l.storage.List(ctx, p, false)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing the activity record: %w", err)
		}
		keys = append(keys, ks...)
	}
	slices.SortFunc(keys, func(a, b string) int { return strings.Compare(path.Base(b), path.Base(a)) })
	cutoff := now().Add(-l.retention)
	var out []gateway.DecisionRecord
	for _, key := range keys {
		if len(out) >= limit {
			break
		}
		if t, ok := keyTime(key); !ok || t.Before(cutoff) {
			continue
		}
		data, err := l.storage.Load(ctx, key)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading the activity record: %w", err)
		}
		var records []gateway.DecisionRecord
		if json.Unmarshal(data, &records) != nil {
			continue
		}
		slices.Reverse(records)
		out = append(out, records...)
	}
	// Objects of several users interleave in time only at their edges:
	// order by decision time, then cut.
	slices.SortStableFunc(out, func(a, b gateway.DecisionRecord) int { return b.Time.Compare(a.Time) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Sweep deletes objects older than the retention and, per user, all but
// the newest perUser; it returns how many it deleted.
func (l *Log) Sweep(ctx context.Context) (int, error) {
	users, err := l.storage.List(ctx, prefix, false)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	cutoff := now().Add(-l.retention)
	n := 0
	for _, u := range users {
		keys, err := l.storage.List(ctx, u, false)
		if err != nil {
			continue
		}
		slices.SortFunc(keys, func(a, b string) int { return strings.Compare(path.Base(b), path.Base(a)) })
		for i, key := range keys {
			t, ok := keyTime(key)
			if ok && !t.Before(cutoff) && (l.perUser <= 0 || i < l.perUser) {
				continue
			}
			if ok && l.storage.Delete(ctx, key) == nil {
				n++
			}
		}
	}
	return n, nil
}
