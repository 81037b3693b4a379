package gateway

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// MCPSession is a runner's MCP session with one service through toolgate.
// The runner knows it by toolgate's own Mcp-Session-Id; toolgate keeps the
// upstream's session id, which the runner never sees. One MCPSession is one
// upstream session.
type MCPSession struct {
	ID        string // toolgate's Mcp-Session-Id (≥128 random bits)
	User      string // the caller who initialized it; only they may use it
	SessionID string // the toolgate session it was created in
	Service   string
	Created   time.Time

	lastUsed atomic.Int64 // unix nanoseconds

	mu             sync.Mutex
	upstream       Upstream
	catalog        map[string]*ToolDefinition
	serverRequests map[string]string // id of a server→client request relayed to the runner → its method

	reinit sync.Mutex // serializes re-initialization
}

// Upstream is the state of the upstream session behind an MCPSession.
type Upstream struct {
	// SessionID is the upstream's Mcp-Session-Id ("" for a server without sessions).
	SessionID string
	// ProtocolVersion is the negotiated protocol version.
	ProtocolVersion string
	// InitializeParams are the params of the runner's initialize request,
	// replayed when the upstream session must be re-created.
	InitializeParams []byte
	// Generation counts (re-)initializations.
	Generation uint64
}

// ToolDefinition is a tool as the upstream published it in tools/list.
type ToolDefinition struct {
	Name string
	Raw  []byte // the tool object's JSON text

	memo atomic.Pointer[any]
}

// Memo returns the value make computes from the definition, computing it
// once. The policy step keeps its converted policy input here.
func (t *ToolDefinition) Memo(make func() any) any {
	if v := t.memo.Load(); v != nil {
		return *v
	}
	v := make()
	t.memo.Store(&v)
	return v
}

// Upstream returns the current upstream state.
func (s *MCPSession) Upstream() Upstream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.upstream
}

// SetUpstream records a new upstream state after an initialize.
func (s *MCPSession) SetUpstream(u Upstream) {
	s.mu.Lock()
	u.Generation = s.upstream.Generation + 1
	s.upstream = u
	s.mu.Unlock()
}

// Reinitialize runs init to replace the upstream session seen at generation
// gen, unless another request already did so; concurrent callers wait and
// share the outcome.
func (s *MCPSession) Reinitialize(gen uint64, init func(Upstream) (Upstream, error)) (Upstream, error) {
	s.reinit.Lock()
	defer s.reinit.Unlock()
	cur := s.Upstream()
	if cur.Generation != gen {
		return cur, nil
	}
	next, err := init(cur)
	if err != nil {
		return cur, err
	}
	s.SetUpstream(next)
	return s.Upstream(), nil
}

// Tool returns the upstream's definition of the tool name, or nil when it
// has not been seen.
func (s *MCPSession) Tool(name string) *ToolDefinition {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.catalog[name]
}

// HasCatalog reports whether the upstream's tools were listed.
func (s *MCPSession) HasCatalog() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.catalog != nil
}

// SetCatalog replaces the known tool definitions.
func (s *MCPSession) SetCatalog(tools map[string]*ToolDefinition) {
	s.mu.Lock()
	s.catalog = tools
	s.mu.Unlock()
}

const maxPendingServerRequests = 256

// ServerRequestSent records a server→client request relayed to the runner,
// so that the runner's answer can be attributed to its method.
func (s *MCPSession) ServerRequestSent(id []byte, method string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.serverRequests == nil {
		s.serverRequests = make(map[string]string)
	}
	if len(s.serverRequests) >= maxPendingServerRequests {
		clear(s.serverRequests)
	}
	s.serverRequests[string(id)] = method
}

// ServerRequestAnswered returns the method of the server→client request id
// answers, and forgets it.
func (s *MCPSession) ServerRequestAnswered(id []byte) (method string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	method, ok = s.serverRequests[string(id)]
	delete(s.serverRequests, string(id))
	return method, ok
}

// Touch marks the session used now.
func (s *MCPSession) Touch() { s.lastUsed.Store(now().UnixNano()) }

// ErrMCPSessionNotFound reports an unknown or expired Mcp-Session-Id.
var ErrMCPSessionNotFound = errors.New("MCP session not found")

// MCPSessions holds the runners' MCP sessions of this process. It outlives
// config reloads (it is kept in a caddy.UsagePool), so a reload drops no
// session. Sessions idle for longer than the idle timeout are forgotten.
type MCPSessions struct {
	mu       sync.Mutex
	sessions map[string]*MCPSession
}

// Destruct implements caddy.Destructor.
func (m *MCPSessions) Destruct() error {
	m.mu.Lock()
	clear(m.sessions)
	m.mu.Unlock()
	return nil
}

// Create starts a new MCP session.
func (m *MCPSessions) Create(user, sessionID, service string) *MCPSession {
	s := &MCPSession{ID: NewID(), User: user, SessionID: sessionID, Service: service, Created: now()}
	s.Touch()
	m.mu.Lock()
	m.sessions[s.ID] = s
	m.mu.Unlock()
	return s
}

// Get returns the session with id.
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

// Delete forgets the session with id.
func (m *MCPSessions) Delete(id string) {
	m.mu.Lock()
	delete(m.sessions, id)
	m.mu.Unlock()
}

// expire forgets sessions idle for longer than idle.
func (m *MCPSessions) expire(idle time.Duration) int {
	cutoff := now().Add(-idle).UnixNano()
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for id, s := range m.sessions {
		if s.lastUsed.Load() < cutoff {
			delete(m.sessions, id)
			n++
		}
	}
	return n
}
