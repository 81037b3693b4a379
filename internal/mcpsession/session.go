// Package mcpsession holds the runners' MCP sessions as one gateway replica
// knows them: what the pipeline's steps use of a session (its upstream
// session, tool catalog, pending server→client requests, resumable
// streams), kept so that any replica continues any session.
//
// A session is what internal/mcpstate stores, plus this replica's copy of
// it and what cannot leave the replica (open streams). Copies are trusted
// until the storage announces a change (internal/storecache), so a
// steady-state request makes no storage round trip; see [Sessions].
package mcpsession

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpstate"
	"github.com/toolgate/toolgate/internal/storecache"
)

// Session is a runner's MCP session with one service through toolgate,
// as this replica holds it. The runner knows it by toolgate's own
// Mcp-Session-Id, which seals the session's storage ref, owner, service and
// expiry (see internal/mcpstate); toolgate keeps the upstream's session id,
// which the runner never sees. One Session is one upstream session.
//
// What any replica needs to continue the session is in the shared storage
// (see Sessions); the object here is this replica's copy of it, plus
// what cannot leave the replica: its open streams and the runner streams
// it keeps for resumption.
//
// A session is open until the runner ends it (DELETE, on any replica) or it
// is idle for the idle timeout; then it is closed for good: its streams
// stop, its upstream session is ended with DELETE, and it never
// initializes upstream again.
type Session struct {
	ID        string // toolgate's Mcp-Session-Id, sealed
	Ref       string // the session's name in storage
	User      string // the caller who initialized it; only they may use it
	SessionID string // the toolgate session it was initialized in
	Service   string
	Created   time.Time
	Expires   time.Time

	m        *Sessions
	lastUsed atomic.Int64 // unix nanoseconds
	inUse    atomic.Int32 // exchanges and streams in progress
	retired  atomic.Bool  // replaced: ends when nothing uses it (Sessions.Retire)
	heldHere atomic.Bool  // a transport module of this replica holds an upstream session of it (HeldHere)

	// Bookkeeping of this copy against the shared state.
	stale   atomic.Bool  // a change was announced since the record was read
	own     atomic.Int32 // this replica's announcements not echoed yet
	checked atomic.Int64 // when the record was last read, unix nanoseconds
	marked  atomic.Int64 // the newest window the session is known marked in
	started bool         // initialized through this replica (counts in max_mcp_sessions)
	local   bool         // this replica's only, never stored (see CreateLocal)

	ctx    context.Context // done when the session closes
	cancel context.CancelFunc
	// retiring is done when a session of this replica's own (local) is
	// retired or closes (Retiring); nil for a stored one.
	retiring  context.Context
	retireNow context.CancelFunc
	reinit    chan struct{} // held while re-initializing

	mu             sync.Mutex
	progress       map[string]int    // progress tokens of the runner's requests in progress here, by mcpmsg.IDKey
	sentIn         map[string]sentIn // the upstream sessions the runner's requests in progress here went to, by mcpmsg.IDKey of their ids
	sentSeq        uint64            // numbers the records of sentIn
	changes        uint64            // announcements received for this session
	closed         bool
	stored         bool            // the record exists in storage
	reserved       *mcpstate.Store // where its initialize holds a slot of its caller's until stored (see initializingPrefix)
	upstream       Upstream
	catalog        *mcpstate.Catalog
	catalogPending chan struct{}             // closed when the listing awaited ends; nil when none is
	listingHere    bool                      // the listing awaited runs on this replica
	catalogGivenUp bool                      // a wait for a listing ran out: later calls do not wait
	serverRequests map[string]relayedRequest // by the key of the id the runner knows
	pendingCounted time.Time                 // when forgetAnsweredElsewhere last asked the storage
	streams        map[string]any            // resumable runner streams, by token
	streamOrder    []string
	links          map[string]mcpstate.Link // see Link
	tasks          map[string]Task          // tasks created through toolgate, by task id
	taskOrder      []string
	taskBytes      int
}

// Task is a task an upstream created for a task-augmented tools/call that
// toolgate relayed (MCP 2025-11-25): what the call was, so that what the
// task yields later is decided as the call's own result would have been.
type Task struct {
	Tool      string // the tool called
	Arguments []byte // the arguments as sent upstream (JSON text)
}

// Upstream is the state of the upstream session behind an Session.
type Upstream struct {
	// SessionID is the upstream's Mcp-Session-Id ("" for a server without sessions).
	SessionID string
	// ProtocolVersion is the negotiated protocol version.
	ProtocolVersion string
	// InitializeParams are what is replayed of the runner's initialize
	// when the upstream session must be re-created: its protocolVersion,
	// capabilities and clientInfo, copied out of the request.
	InitializeParams []byte
	// Generation counts (re-)initializations.
	Generation uint64
	// Endpoint names the upstream the session was initialized with (the
	// service's gateway.Service.Endpoint then). It stays with the session
	// through re-initializations: a session whose service names another
	// upstream since (a reload changed its url or transport) is over, as
	// its upstream session id, tool catalog and everything else the old
	// upstream said belong to that upstream. "" for a session whose
	// upstream is not one service's (a federated one), or stored by an
	// older version.
	Endpoint string
	// Grant names the caller's connection whose credential initialized
	// the upstream session (gateway.Connection.Grant). It stays with the
	// session: when the caller connects again (another personal token,
	// another consent, maybe another account at the provider), the
	// session is over, as its upstream session, tool catalog, streams and
	// everything else the upstream said through it are the old
	// connection's. "" for a service without per-user credentials.
	Grant string
}

// Ref names the upstream session in a record kept beside it (a pending
// server→client request's), without its id, which is a credential of
// sorts at the upstream: the hex SHA-256 of SessionID, shortened; "" for
// a server without sessions. A stdio program's bridge keeps its session id
// through re-initializations (the process the last one replaced winds
// down, taking what its calls wait for), so two generations may share a
// Ref.
func (u Upstream) Ref() string {
	if u.SessionID == "" {
		return ""
	}
	sum := sha256.Sum256([]byte("toolgate upstream session\x00" + u.SessionID))
	return hex.EncodeToString(sum[:16])
}

// From reports whether the session's upstream is the one endpoint names
// (a service's Endpoint): true for a session that recorded none.
func (u Upstream) From(endpoint string) bool { return u.Endpoint == "" || u.Endpoint == endpoint }

// now is the clock; tests replace it.
var now = time.Now

// ErrStorageUnavailable reports that the storage could not be read or
// written: worth retrying.
var ErrStorageUnavailable = storecache.ErrUnavailable

// ToolDefinition is a tool as the upstream published it in tools/list.
// Sessions whose upstreams list the same tools share the definitions.
type ToolDefinition = mcpstate.Tool

// ErrClosed reports a session that was ended (DELETE or idle
// expiry) while a request was using it.
var ErrClosed = errors.New("the MCP session was ended")

// Context is done when the session closes; streams relayed for it stop then.
func (s *Session) Context() context.Context { return s.ctx }

// Closed reports whether the session was ended.
func (s *Session) Closed() bool { return s.ctx.Err() != nil }

// Retiring is done when the session closes or is retired (see
// Sessions.Retire): what only ends when its runner lets go, a listen,
// stops then, while a call in progress runs to its end.
func (s *Session) Retiring() context.Context {
	if s.retiring == nil {
		return s.ctx // a stored session: it is never retired
	}
	return s.retiring
}

// HeldHere records that a transport module of this replica (a program, a
// legacy SSE connection) holds an upstream session of s: when another
// replica ends s, this one hears it (with storages that announce changes)
// and hands s to the end hook marked Elsewhere, so the module ends what it
// holds at once rather than at its idle timeout.
func (s *Session) HeldHere() {
	if !s.heldHere.Load() {
		s.heldHere.Store(true)
	}
}

// Upstream returns the current upstream state.
func (s *Session) Upstream() Upstream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.upstream
}

// Begin marks the session in use until the returned function is called:
// an open stream or an exchange in progress is use, and a session in use
// never expires.
func (s *Session) Begin() (end func()) {
	s.inUse.Add(1)
	s.Touch()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.Touch()
			if s.inUse.Add(-1) == 0 && s.retired.Load() {
				s.m.retire(s)
			}
		})
	}
}

// Touch marks the session used now.
func (s *Session) Touch() { s.lastUsed.Store(now().UnixNano()) }

// MaxResumableStreams bounds the runner streams one MCP session keeps for
// resumption once their relay ended (the runner dropped them); streams
// still being written are bounded by the stream places of their caller.
const MaxResumableStreams = 8

// KeepStream makes a runner stream that the runner may resume findable
// under token (Stream). The proxy owns what v is. Streams are this
// replica's: a runner resumes a stream on the replica that wrote it. It
// reports false, keeping nothing, when the session has ended.
func (s *Session) KeepStream(token string, v any) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.streams == nil {
		s.streams = make(map[string]any)
	}
	s.streams[token] = v
	return true
}

// StreamDropped records that nothing writes the stream kept under token
// any more: of such streams the session keeps the latest
// MaxResumableStreams, and returns those it forgot to make room.
func (s *Session) StreamDropped(token string) (evicted []any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.streams[token]; !ok {
		return nil
	}
	s.streamOrder = append(removeToken(s.streamOrder, token), token)
	for len(s.streamOrder) > MaxResumableStreams {
		evicted = append(evicted, s.streams[s.streamOrder[0]])
		delete(s.streams, s.streamOrder[0])
		s.streamOrder = s.streamOrder[1:]
	}
	return evicted
}

// StreamResumed records that the stream kept under token is written again
// (the runner resumed it): it no longer counts among the dropped ones.
func (s *Session) StreamResumed(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streamOrder = removeToken(s.streamOrder, token)
}

func removeToken(order []string, token string) []string {
	for i, t := range order {
		if t == token {
			return append(order[:i], order[i+1:]...)
		}
	}
	return order
}

// Stream returns the stream kept under token, or nil.
func (s *Session) Stream(token string) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams[token]
}

// ForgetStream drops the stream kept under token.
func (s *Session) ForgetStream(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.streams, token)
	s.streamOrder = removeToken(s.streamOrder, token)
}

// Bounds of the tasks one MCP session remembers: beyond either, the
// oldest are forgotten (and what they yield is refused).
const (
	MaxTasks         = 256
	MaxTaskArguments = 8 << 20 // bytes of arguments, all tasks together
)

// TaskCreated remembers the task id as created by the call t, here and in
// the shared storage, so that the task's later requests are decided on any
// replica. A task id the session knows already keeps its first call: an
// upstream cannot move a task to another call by naming it again. When
// the storage is unavailable the task is known here only (and logged).
func (s *Session) TaskCreated(ctx context.Context, id string, t Task) {
	t.Arguments = append([]byte(nil), t.Arguments...) // not the request body's memory
	forgotten, added := s.rememberTask(id, t)
	if s.local {
		return
	}
	st := s.m.state()
	if added {
		if err := st.TaskCreated(ctx, s.m.cfg().Keys, s.Ref, id, mcpstate.TaskCall{Tool: t.Tool, Arguments: t.Arguments}); err != nil {
			s.m.logger().Warn("cannot record a task in storage; other replicas will refuse its requests",
				zap.String("service", s.Service), zap.Error(err))
		}
	}
	for _, old := range forgotten {
		st.TaskForgotten(ctx, s.Ref, old)
	}
}

// rememberTask keeps t as the task id's call here, within the bounds; it
// returns the tasks forgotten to make room, and whether id was new.
func (s *Session) rememberTask(id string, t Task) (forgotten []string, added bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, false
	}
	if _, ok := s.tasks[id]; ok {
		return nil, false
	}
	if s.tasks == nil {
		s.tasks = make(map[string]Task)
	}
	s.tasks[id] = t
	s.taskOrder = append(s.taskOrder, id)
	s.taskBytes += len(t.Arguments)
	for len(s.taskOrder) > MaxTasks || s.taskBytes > MaxTaskArguments && len(s.taskOrder) > 1 {
		old := s.taskOrder[0]
		s.taskBytes -= len(s.tasks[old].Arguments)
		delete(s.tasks, old)
		s.taskOrder = s.taskOrder[1:]
		forgotten = append(forgotten, old)
	}
	return forgotten, true
}

// Task returns the call that created the task id, if the session knows it:
// from this replica's memory, or from the storage when another replica
// relayed the call (an error wrapping ErrStorageUnavailable when it cannot
// be read).
func (s *Session) Task(ctx context.Context, id string) (Task, bool, error) {
	s.mu.Lock()
	t, ok := s.tasks[id]
	closed := s.closed
	s.mu.Unlock()
	if ok || closed || s.local {
		return t, ok, nil
	}
	call, ok, err := s.m.state().Task(ctx, s.m.cfg().Keys, s.Ref, id)
	if err != nil {
		return Task{}, false, fmt.Errorf("%w: %v", ErrStorageUnavailable, err)
	}
	if !ok {
		return Task{}, false, nil
	}
	t = Task{Tool: call.Tool, Arguments: call.Arguments}
	s.rememberTask(id, t) // what another replica stored is kept here, as read
	return t, true, nil
}

// close ends the session here, once; later calls report false.
func (s *Session) close() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.closed = true
	s.cancel()
	s.endListingLocked()
	s.streams, s.streamOrder, s.serverRequests = nil, nil, nil
	return true
}

// invalidate records that the session's record changed: the copy is read
// again before its next use.
func (s *Session) invalidate() {
	s.mu.Lock()
	s.changes++
	s.stale.Store(true)
	s.mu.Unlock()
}

// changeCount is the number of changes announced so far.
func (s *Session) changeCount() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changes
}

// apply takes the stored record as this replica's copy. The copy is
// trusted (no longer stale) only if no change was announced since the
// record was read: changes is the count taken before reading, and seq, when
// not nil, must still hold the gateway-wide count taken then (for a copy
// made while its first read was in flight).
func (s *Session) apply(rec *mcpstate.Record, catalog *mcpstate.Catalog, changes uint64, seq *uint64, waitListing bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.stored = true
	if rec.Upstream.Generation >= s.upstream.Generation {
		s.upstream = upstreamOf(rec)
	}
	s.links = rec.Links
	switch {
	case s.listingHere:
		// A listing runs here: it replaces the catalog when it ends, and
		// the one stored before it must not end the wait for it.
	case catalog != nil:
		s.setCatalogLocked(catalog)
	case waitListing && s.catalog == nil && s.catalogPending == nil && !s.catalogGivenUp:
		// Another replica is listing the tools (it was told
		// notifications/initialized): calls here wait for it too.
		s.catalogPending = make(chan struct{})
	}
	s.checked.Store(now().UnixNano())
	if s.changes == changes && (seq == nil || s.m.seq.Load() == *seq) {
		s.stale.Store(false)
	}
}
