package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// MCPSession is a runner's MCP session with one service through toolgate.
// The runner knows it by toolgate's own Mcp-Session-Id; toolgate keeps the
// upstream's session id, which the runner never sees. One MCPSession is one
// upstream session.
//
// A session is open until the runner ends it (DELETE) or it is idle for the
// idle timeout; then it is closed for good: its streams stop, its upstream
// session is ended with DELETE, and it never initializes upstream again.
type MCPSession struct {
	ID        string // toolgate's Mcp-Session-Id (≥128 random bits)
	User      string // the caller who initialized it; only they may use it
	SessionID string // the toolgate session it was created in
	Service   string
	Created   time.Time

	lastUsed atomic.Int64 // unix nanoseconds
	inUse    atomic.Int32 // exchanges and streams in progress

	ctx    context.Context // done when the session closes
	cancel context.CancelFunc
	reinit chan struct{} // held while re-initializing

	mu             sync.Mutex
	closed         bool
	upstream       Upstream
	catalog        map[string]*ToolDefinition
	catalogKnown   bool          // the upstream's tools were listed at least once
	catalogPending chan struct{} // closed when the listing in progress ends; nil when none is
	serverRequests map[string]string
	streams        map[string]any // resumable runner streams, by token
	streamOrder    []string
	tasks          map[string]Task // tasks created through toolgate, by task id
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

// Upstream is the state of the upstream session behind an MCPSession.
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
}

// ToolDefinition is a tool as the upstream published it in tools/list.
type ToolDefinition struct {
	Name string
	Raw  []byte // the tool object's JSON text

	memo atomic.Pointer[toolMemo]
}

type toolMemo struct {
	key   any
	value any
}

// Memo returns the value make computes from the definition and key,
// computing it once per key: again only when called with another key (the
// policy step keeps the tool's policy input here, keyed on the service
// whose configuration it reflects, which a config reload replaces).
func (t *ToolDefinition) Memo(key any, make func() any) any {
	if m := t.memo.Load(); m != nil && m.key == key {
		return m.value
	}
	v := make()
	t.memo.Store(&toolMemo{key: key, value: v})
	return v
}

// ErrMCPSessionClosed reports a session that was ended (DELETE or idle
// expiry) while a request was using it.
var ErrMCPSessionClosed = errors.New("the MCP session was ended")

// Context is done when the session closes; streams relayed for it stop then.
func (s *MCPSession) Context() context.Context { return s.ctx }

// Closed reports whether the session was ended.
func (s *MCPSession) Closed() bool { return s.ctx.Err() != nil }

// Upstream returns the current upstream state.
func (s *MCPSession) Upstream() Upstream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.upstream
}

// SetUpstream records a new upstream state after an initialize. It fails
// when the session was closed meanwhile; the caller then ends u upstream.
func (s *MCPSession) SetUpstream(u Upstream) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrMCPSessionClosed
	}
	u.Generation = s.upstream.Generation + 1
	s.upstream = u
	return nil
}

// Reinitialize runs init to replace the upstream session seen at generation
// gen, unless another request already did so; concurrent callers share the
// outcome. Waiting for another re-initialization honours ctx. A closed
// session is never re-initialized: ErrMCPSessionClosed; and when it closes
// while init runs, the new upstream session is handed to discard (which
// ends it) instead of being kept.
func (s *MCPSession) Reinitialize(ctx context.Context, gen uint64, init func(Upstream) (Upstream, error), discard func(Upstream)) (Upstream, error) {
	select {
	case s.reinit <- struct{}{}:
	case <-ctx.Done():
		return s.Upstream(), fmt.Errorf("waiting for the upstream session to be re-created: %w", ctx.Err())
	}
	defer func() { <-s.reinit }()
	if s.Closed() {
		return s.Upstream(), ErrMCPSessionClosed
	}
	cur := s.Upstream()
	if cur.Generation != gen {
		return cur, nil
	}
	next, err := init(cur)
	if err != nil {
		return cur, err
	}
	if err := s.SetUpstream(next); err != nil {
		discard(next)
		return cur, err
	}
	return s.Upstream(), nil
}

// Begin marks the session in use until the returned function is called:
// an open stream or an exchange in progress is use, and a session in use
// never expires.
func (s *MCPSession) Begin() (end func()) {
	s.inUse.Add(1)
	s.Touch()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.Touch()
			s.inUse.Add(-1)
		})
	}
}

// Tool returns the upstream's definition of the tool name, or nil when it
// has not been seen.
func (s *MCPSession) Tool(name string) *ToolDefinition {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.catalog[name]
}

// ToolListed records a tool's definition as the upstream just listed it to
// the runner, when it differs from the one known: the runner's listing is
// the latest, and a call is decided (and its tool's pin checked) with the
// definition the runner was shown.
func (s *MCPSession) ToolListed(name string, raw []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.catalog[name]; old != nil && bytes.Equal(old.Raw, raw) {
		return
	}
	if s.catalog == nil {
		s.catalog = make(map[string]*ToolDefinition)
	}
	s.catalog[name] = &ToolDefinition{Name: name, Raw: bytes.Clone(raw)}
}

// ListingTools marks the upstream's tool list as being fetched: calls
// waiting for a catalog (WaitCatalog) wait until CatalogListed or
// CatalogFailed. It reports false when a listing was pending already.
func (s *MCPSession) ListingTools() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.catalogPending != nil || s.closed {
		return false
	}
	s.catalogPending = make(chan struct{})
	return true
}

// CatalogListed replaces the known tool definitions.
func (s *MCPSession) CatalogListed(tools map[string]*ToolDefinition) {
	s.mu.Lock()
	s.catalog, s.catalogKnown = tools, true
	s.endListingLocked()
	s.mu.Unlock()
}

// CatalogFailed ends a listing that did not succeed; the definitions known
// before (if any) stay.
func (s *MCPSession) CatalogFailed() {
	s.mu.Lock()
	s.endListingLocked()
	s.mu.Unlock()
}

func (s *MCPSession) endListingLocked() {
	if s.catalogPending != nil {
		close(s.catalogPending)
		s.catalogPending = nil
	}
}

// HasCatalog reports whether the upstream's tools were listed.
func (s *MCPSession) HasCatalog() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.catalogKnown
}

// WaitCatalog waits, at most max, for a tool listing in progress (the first
// one starts when the session is created), so that a call racing it is
// decided with the tool's definition. It reports whether the catalog is
// known. A wait that runs out ends the pending listing, so that later
// calls of a runner that never sent notifications/initialized do not wait.
func (s *MCPSession) WaitCatalog(ctx context.Context, max time.Duration) bool {
	s.mu.Lock()
	pending := s.catalogPending
	s.mu.Unlock()
	if pending != nil {
		t := time.NewTimer(max)
		select {
		case <-pending:
		case <-t.C:
			s.mu.Lock()
			if s.catalogPending == pending {
				s.endListingLocked()
			}
			s.mu.Unlock()
		case <-ctx.Done():
		case <-s.ctx.Done():
		}
		t.Stop()
	}
	return s.HasCatalog()
}

// MaxPendingServerRequests bounds the server→client requests of one MCP
// session waiting for the runner's answer.
const MaxPendingServerRequests = 256

// ServerRequestSent records a server→client request relayed to the runner,
// so that the runner's answer can be attributed to its method. It reports
// false, recording nothing, when the session has too many pending already;
// the request must then be refused rather than relayed.
func (s *MCPSession) ServerRequestSent(id []byte, method string) bool {
	key := mcpmsg.IDKey(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.serverRequests == nil {
		s.serverRequests = make(map[string]string)
	}
	if _, dup := s.serverRequests[key]; !dup && len(s.serverRequests) >= MaxPendingServerRequests {
		return false
	}
	s.serverRequests[key] = method
	return true
}

// ServerRequestAnswered returns the method of the pending server→client
// request that id (however the runner spelled it) answers, and forgets it.
// ok is false when no such request is pending.
func (s *MCPSession) ServerRequestAnswered(id []byte) (method string, ok bool) {
	key := mcpmsg.IDKey(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	method, ok = s.serverRequests[key]
	delete(s.serverRequests, key)
	return method, ok
}

// MaxResumableStreams bounds the runner streams one MCP session keeps for
// resumption.
const MaxResumableStreams = 8

// KeepStream remembers a runner stream that the runner may resume, under
// token. The proxy owns what v is. The oldest is forgotten beyond
// MaxResumableStreams.
func (s *MCPSession) KeepStream(token string, v any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.streams == nil {
		s.streams = make(map[string]any)
	}
	if _, ok := s.streams[token]; !ok {
		s.streamOrder = append(s.streamOrder, token)
	}
	s.streams[token] = v
	for len(s.streamOrder) > MaxResumableStreams {
		delete(s.streams, s.streamOrder[0])
		s.streamOrder = s.streamOrder[1:]
	}
}

// Stream returns the stream kept under token, or nil.
func (s *MCPSession) Stream(token string) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams[token]
}

// ForgetStream drops the stream kept under token.
func (s *MCPSession) ForgetStream(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.streams[token]; !ok {
		return
	}
	delete(s.streams, token)
	for i, t := range s.streamOrder {
		if t == token {
			s.streamOrder = append(s.streamOrder[:i], s.streamOrder[i+1:]...)
			break
		}
	}
}

// Bounds of the tasks one MCP session remembers: beyond either, the
// oldest are forgotten (and what they yield is refused).
const (
	MaxTasks         = 256
	MaxTaskArguments = 8 << 20 // bytes of arguments, all tasks together
)

// TaskCreated remembers the task id as created by the call t. A task id
// the session knows already keeps its first call: an upstream cannot move
// a task to another call by naming it again.
func (s *MCPSession) TaskCreated(id string, t Task) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if _, ok := s.tasks[id]; ok {
		return
	}
	if s.tasks == nil {
		s.tasks = make(map[string]Task)
	}
	t.Arguments = append([]byte(nil), t.Arguments...) // not the request body's memory
	s.tasks[id] = t
	s.taskOrder = append(s.taskOrder, id)
	s.taskBytes += len(t.Arguments)
	for len(s.taskOrder) > MaxTasks || s.taskBytes > MaxTaskArguments && len(s.taskOrder) > 1 {
		s.taskBytes -= len(s.tasks[s.taskOrder[0]].Arguments)
		delete(s.tasks, s.taskOrder[0])
		s.taskOrder = s.taskOrder[1:]
	}
}

// Task returns the call that created the task id, if the session knows it.
func (s *MCPSession) Task(id string) (Task, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tasks[id]
	return t, ok
}

// Touch marks the session used now.
func (s *MCPSession) Touch() { s.lastUsed.Store(now().UnixNano()) }

// close ends the session and returns its upstream state, once; later calls
// report false.
func (s *MCPSession) close() (Upstream, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Upstream{}, false
	}
	s.closed = true
	s.cancel()
	s.endListingLocked()
	s.streams, s.streamOrder, s.serverRequests = nil, nil, nil
	return s.upstream, true
}

// ErrMCPSessionNotFound reports an unknown or expired Mcp-Session-Id.
var ErrMCPSessionNotFound = errors.New("MCP session not found")

// MCPSessionLimitError reports an initialize refused because the caller,
// or the gateway, has as many MCP sessions as allowed.
type MCPSessionLimitError struct {
	Option string // the option that sets the limit
	Limit  int
}

func (e *MCPSessionLimitError) Error() string {
	return fmt.Sprintf("too many open MCP sessions (%s is %d): end unused sessions with DELETE, or wait until idle ones expire", e.Option, e.Limit)
}

// MCPSessions holds the runners' MCP sessions of this process. It outlives
// config reloads (it is kept in a caddy.UsagePool), so a reload drops no
// session. The number of sessions is bounded per caller and in all.
type MCPSessions struct {
	mu        sync.Mutex
	sessions  map[string]*MCPSession
	perUser   map[string]int
	max       int
	perCaller int
}

func newMCPSessions() *MCPSessions {
	return &MCPSessions{sessions: make(map[string]*MCPSession), perUser: make(map[string]int),
		max: defaultMaxMCPSessions, perCaller: defaultMaxMCPSessionsPerCaller}
}

// Destruct implements caddy.Destructor.
func (m *MCPSessions) Destruct() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.sessions {
		s.close()
	}
	clear(m.sessions)
	clear(m.perUser)
	return nil
}

// setLimits applies the configured bounds; sessions over a lowered bound
// stay until they end.
func (m *MCPSessions) setLimits(max, perCaller int) {
	m.mu.Lock()
	m.max, m.perCaller = max, perCaller
	m.mu.Unlock()
}

// Create starts a new MCP session for user, or fails with an
// *MCPSessionLimitError. Its first tool listing counts as pending (see
// WaitCatalog).
func (m *MCPSessions) Create(user, sessionID, service string) (*MCPSession, error) {
	ctx, cancel := context.WithCancel(context.Background())
	s := &MCPSession{ID: NewID(), User: user, SessionID: sessionID, Service: service, Created: now(),
		ctx: ctx, cancel: cancel, reinit: make(chan struct{}, 1), catalogPending: make(chan struct{})}
	s.Touch()
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case len(m.sessions) >= m.max:
		cancel()
		return nil, &MCPSessionLimitError{Option: "max_mcp_sessions", Limit: m.max}
	case m.perUser[user] >= m.perCaller:
		cancel()
		return nil, &MCPSessionLimitError{Option: "max_mcp_sessions_per_caller", Limit: m.perCaller}
	}
	m.sessions[s.ID] = s
	m.perUser[user]++
	return s, nil
}

// Get returns the open session with id.
func (m *MCPSessions) Get(id string) (*MCPSession, error) {
	m.mu.Lock()
	s := m.sessions[id]
	m.mu.Unlock()
	if s == nil {
		return nil, ErrMCPSessionNotFound
	}
	s.Touch()
	return s, nil
}

// End closes the session and forgets it. It returns the upstream state to
// end upstream, and whether this call closed it (false when it was closed
// already).
func (m *MCPSessions) End(s *MCPSession) (Upstream, bool) {
	m.mu.Lock()
	m.forgetLocked(s)
	m.mu.Unlock()
	return s.close()
}

func (m *MCPSessions) forgetLocked(s *MCPSession) {
	if m.sessions[s.ID] != s {
		return
	}
	delete(m.sessions, s.ID)
	if m.perUser[s.User]--; m.perUser[s.User] <= 0 {
		delete(m.perUser, s.User)
	}
}

// Len returns the number of open sessions.
func (m *MCPSessions) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sessions)
}

// Ended is a session closed by expiry, with the upstream state to end.
type Ended struct {
	Session  *MCPSession
	Upstream Upstream
}

// expire closes the sessions not in use and idle for longer than idle, and
// returns them.
func (m *MCPSessions) expire(idle time.Duration) []Ended {
	cutoff := now().Add(-idle).UnixNano()
	m.mu.Lock()
	var idleOnes []*MCPSession
	for _, s := range m.sessions {
		if s.inUse.Load() == 0 && s.lastUsed.Load() < cutoff {
			idleOnes = append(idleOnes, s)
			m.forgetLocked(s)
		}
	}
	m.mu.Unlock()
	ended := make([]Ended, 0, len(idleOnes))
	for _, s := range idleOnes {
		if up, ok := s.close(); ok {
			ended = append(ended, Ended{Session: s, Upstream: up})
		}
	}
	return ended
}
