package mcpsession

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpstate"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/storecache"
)

// ErrNotFound reports an unknown, expired or ended Mcp-Session-Id,
// or one that does not open with any of the gateway's keys.
var ErrNotFound = errors.New("MCP session not found")

// ErrForeign reports an Mcp-Session-Id of another caller or
// toolgate session.
var ErrForeign = errors.New("this MCP session belongs to another caller or toolgate session")

// errNotAttached is Open's and Create's error before any configuration
// is attached (the gateway has not finished starting, or has stopped).
var errNotAttached = fmt.Errorf("%w: no configuration is attached to the MCP sessions yet (toolgate is starting)", ErrStorageUnavailable)

// LimitError reports an initialize refused because the caller,
// or the gateway, has as many MCP sessions as allowed.
type LimitError struct {
	Option string // the option that sets the limit
	Limit  int
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("too many open MCP sessions (%s is %d): end unused sessions with DELETE, or wait until idle ones expire", e.Option, e.Limit)
}

// Ended is a session ended by idle expiry, with the upstream
// session to end.
type Ended struct {
	ID       string // its Mcp-Session-Id, when this replica held a copy
	User     string
	Service  string
	Upstream Upstream
	// Elsewhere marks a session another replica ended (and ended its
	// upstream session): only what this replica holds of it itself, a
	// transport module's session (see Session.HeldHere), is to end.
	Elsewhere bool
}

// Sessions holds the runners' MCP sessions as this replica knows them.
// It outlives config reloads (it is kept in a caddy.UsagePool), so a
// reload drops no session.
//
// Any replica continues any session: the Mcp-Session-Id seals what never
// changes (checked on every request without storage), the shared storage
// holds the rest (internal/mcpstate), and this replica keeps a copy of
// each session it served, trusted until a change is announced (or, with
// storages that announce nothing, for cache_ttl). A steady-state request
// therefore costs no storage round trip. Initializing one is bounded per
// caller across replicas (max_mcp_sessions_per_caller) and per process
// (max_mcp_sessions: the sessions initialized here and still held here).
type Sessions struct {
	config  atomic.Pointer[Config]
	process *seal.Keyring // this process's own key: ids sealed with it outlive reloads, not restarts

	mu        sync.Mutex
	sessions  map[string]*Session // by ref
	started   int
	localUser map[string]int // local sessions by user
	// heldAt is when each user's record of local sessions was written
	// (see storeHeld); holder names this replica's records.
	heldAt map[string]time.Time
	holder string

	// seq counts announced session changes, so that a copy made from a
	// record read while a change was announced is not trusted.
	seq     atomic.Uint64
	reloads chan struct{} // bounds background reads
	// background counts the reads and ends started in the background,
	// so that Destruct returns only once none runs (each is bounded);
	// stopped (under mu) is set by Destruct, and nothing starts after it
	// (see goBackground).
	background sync.WaitGroup
	stopped    bool
	lastTick   time.Time
}

// Config is what a configuration of the gateway gives Sessions.
type Config struct {
	// State is where sessions live beyond this process.
	State *mcpstate.Store
	// Keys seal and open Mcp-Session-Ids (from state_secret); nil: a
	// key of this process only.
	Keys *seal.Keyring
	// Max bounds the sessions initialized here and held here
	// (max_mcp_sessions); PerCaller the sessions of one caller on every
	// replica (max_mcp_sessions_per_caller).
	Max, PerCaller int
	// CacheTTL is how long a copy is trusted when the storage announces
	// no changes.
	CacheTTL time.Duration
	// Idle is the idle timeout (mcp_session_idle_timeout).
	Idle time.Duration
	// Sweep is how often Housekeep runs (mcp_session_sweep_interval).
	Sweep time.Duration
	// Logger logs what goes wrong in the background.
	Logger *zap.Logger
	// OnEnd ends the upstream session of a session that ended without
	// its runner's DELETE (it expired, or was retired): see
	// gateway.App.OnMCPSessionEnd.
	OnEnd func(Ended)
	// Endpoint names each service's upstream in this configuration (its
	// gateway.Service.Endpoint), and reports whether the service exists:
	// see EndMoved.
	Endpoint func(service string) (string, bool)
	// Allows reports whether this configuration lets user use service
	// (true for a service it does not define: Endpoint judges those); nil
	// lets everyone. See EndMoved.
	Allows func(service, user string) bool

	previous *Config     // in force before this one was attached
	detached atomic.Bool // Detach was called: never in force again
}

// maxBackgroundReads bounds the reads of changed sessions in flight.
const maxBackgroundReads = 16

// listingWait is how young a session without a tool catalog must be for a
// replica to wait for the listing another replica is making.
const listingWait = time.Minute

// New returns an empty set of sessions; Attach gives it a configuration.
func New() *Sessions {
	return &Sessions{process: seal.Random(mcpstate.Purpose), sessions: make(map[string]*Session),
		localUser: make(map[string]int), heldAt: make(map[string]time.Time), holder: mcpstate.NewRef(),
		reloads: make(chan struct{}, maxBackgroundReads)}
}

// Destruct implements caddy.Destructor.
func (m *Sessions) Destruct() error {
	m.mu.Lock()
	all := make([]*Session, 0, len(m.sessions))
	for _, s := range m.sessions {
		all = append(all, s)
	}
	clear(m.sessions)
	clear(m.localUser)
	held := slices.Collect(maps.Keys(m.heldAt))
	clear(m.heldAt)
	m.started = 0
	m.stopped = true
	m.mu.Unlock()
	for _, s := range all {
		s.close()
	}
	m.background.Wait()
	if c := m.cfg(); c != nil && len(held) > 0 {
		// This replica's local sessions count no more (a record left runs
		// out within heldLease).
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		for _, user := range held {
			_ = m.storeHeld(ctx, c, user, 0)
		}
		cancel()
	}
	return nil
}

// Attach makes c the configuration in force and follows the changes its
// storage announces. Copies read from another storage are read again.
func (m *Sessions) Attach(c *Config) error {
	if c.Keys == nil {
		c.Keys = m.process
	} else {
		c.Keys = c.Keys.With(m.process)
	}
	w := c.State.Watch()
	w.OnChange(func(ch storecache.Change) { m.changed(c, ch) })
	m.mu.Lock()
	if m.lastTick.IsZero() {
		m.lastTick = now()
	}
	m.mu.Unlock()
	// previous is set before c is published: requests read it (moved).
	// Caddy attaches and detaches configurations one at a time.
	old := m.config.Load()
	c.previous = old
	m.config.Store(c)
	if old != nil && old.State != c.State {
		m.changed(c, storecache.Change{Reset: true})
	}
	return w.Start(c.Logger)
}

// Detach stops following c's storage. A configuration replaced by a newer
// one is simply no longer followed. One still in force is either the
// last one (it stays in force) or one whose load Caddy abandoned after it
// started (another app failed to start): then the configuration that was
// in force before it, still running, is in force again — with its keys,
// storage and limits, so its sessions go on.
func (m *Sessions) Detach(c *Config) {
	c.detached.Store(true)
	c.State.Watch().Stop()
	if cur := m.config.Load(); cur != c && cur != nil && cur.previous == c && cur.Endpoint != nil {
		// c was replaced, and the configuration that replaced it is in
		// force for good (Caddy stops the old one only once the new one
		// started): the sessions of services it points elsewhere end now.
		// Not when it starts: a load Caddy abandons must change nothing.
		m.goBackground(func() { m.endMovedIfInForce(cur) })
	}
	prev := c.previous
	if prev == nil || prev.detached.Load() || !m.config.CompareAndSwap(c, prev) {
		return
	}
	if prev.State != c.State {
		m.changed(prev, storecache.Change{Reset: true})
	}
	if prev.Endpoint != nil {
		// Sessions initialized through the abandoned configuration, with
		// an upstream the one in force again does not name, end (their
		// initialize's own look, moved, left them to this).
		m.goBackground(func() { m.endMovedIfInForce(prev) })
	}
}

// endMovedIfInForce runs EndMoved with c's upstreams while c is in force:
// once another configuration is, its own Detach, or the Detach that
// abandons it, judges the sessions (a reload that moved a service back
// would otherwise see its sessions ended by c's view of it).
func (m *Sessions) endMovedIfInForce(c *Config) {
	if m.cfg() == c {
		m.EndMoved(context.Background(), c.Endpoint)
		m.EndBarred(context.Background(), c.Allows)
	}
}

func (m *Sessions) cfg() *Config           { return m.config.Load() }
func (m *Sessions) state() *mcpstate.Store { return m.cfg().State }
func (m *Sessions) logger() *zap.Logger    { return m.cfg().Logger }

// fresh reports whether the copy s may be used without reading storage.
func (m *Sessions) fresh(c *Config, s *Session) bool {
	if s.stale.Load() {
		return false
	}
	return c.State.Watch().Live() || now().UnixNano()-s.checked.Load() < int64(c.CacheTTL)
}

// Open returns the session the runner's Mcp-Session-Id names, for user in
// the toolgate session toolgateSession ("" when the runner named none: the
// session's own, see Session.SessionID): ErrNotFound when the id
// is not one of the gateway's, has expired or names a session that ended;
// ErrForeign when it is another caller's; an error wrapping
// ErrStorageUnavailable when the session's record cannot be read. The
// first use of a session on this replica, and the first after a change,
// read its record; other uses read nothing.
func (m *Sessions) Open(ctx context.Context, id, user, toolgateSession string) (*Session, error) {
	c := m.cfg()
	if c == nil {
		return nil, errNotAttached
	}
	claims, err := mcpstate.Open(c.Keys, id)
	if err != nil || claims.Expired(now()) {
		return nil, ErrNotFound
	}
	if toolgateSession == "" {
		toolgateSession = claims.Session
	}
	if claims.Session != toolgateSession || !claims.Owns(user, toolgateSession) {
		return nil, ErrForeign
	}
	m.mu.Lock()
	s := m.sessions[claims.Ref]
	m.mu.Unlock()
	if s != nil {
		if s.Closed() || s.local {
			return nil, ErrNotFound
		}
		if m.fresh(c, s) {
			s.Touch()
			return s, nil
		}
	}
	seq := m.seq.Load()
	var changes uint64
	if s != nil {
		changes = s.changeCount()
	}
	rec, catalog, err := m.read(ctx, c, claims.Ref)
	if errors.Is(err, mcpstate.ErrNotFound) || err == nil && (rec.User != user || rec.Service != claims.Service) {
		switch {
		case s != nil && err != nil:
			m.endedElsewhere(c, s)
		case s != nil:
			m.closeLocal(s)
		}
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	var seqAtRead *uint64
	if s == nil {
		// A change announced while the record was read found no copy to
		// mark stale: the gateway-wide count tells.
		s, seqAtRead = m.adopt(claims, id, rec), &seq
		changes = s.changeCount()
	}
	s.apply(rec, catalog, changes, seqAtRead, now().Sub(rec.Created) < listingWait)
	if s.Closed() {
		return nil, ErrNotFound
	}
	s.Touch()
	return s, nil
}

// read reads the session's record and its catalog.
func (m *Sessions) read(ctx context.Context, c *Config, ref string) (*mcpstate.Record, *mcpstate.Catalog, error) {
	rec, err := c.State.Load(ctx, ref)
	if errors.Is(err, mcpstate.ErrNotFound) {
		return nil, nil, err
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrStorageUnavailable, err)
	}
	if rec.Catalog == "" {
		return rec, nil, nil
	}
	catalog, err := c.State.Catalog(ctx, rec.Catalog)
	switch {
	case errors.Is(err, mcpstate.ErrNotFound):
		c.Logger.Warn("an MCP session's tool catalog is missing from storage; its tools are judged without definitions",
			zap.String("service", rec.Service))
		return rec, nil, nil
	case err != nil:
		return nil, nil, fmt.Errorf("%w: %v", ErrStorageUnavailable, err)
	}
	return rec, catalog, nil
}

// adopt makes this replica's copy of a session initialized elsewhere (or
// here, before a restart or after it was evicted), or returns the copy a
// concurrent request made.
func (m *Sessions) adopt(claims mcpstate.ID, id string, rec *mcpstate.Record) *Session {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Session{ID: id, Ref: claims.Ref, User: rec.User, SessionID: claims.Session, Service: rec.Service, Created: rec.Created, Expires: claims.Expires,
		m: m, ctx: ctx, cancel: cancel, reinit: make(chan struct{}, 1)}
	s.stale.Store(true)
	s.Touch()
	m.mu.Lock()
	defer m.mu.Unlock()
	if other := m.sessions[claims.Ref]; other != nil && !other.Closed() {
		cancel()
		return other
	}
	m.sessions[claims.Ref] = s
	return s
}

// reload reads s's record again; a session that ended is closed here. A
// session initialized here and not stored yet (an initialize in flight,
// or one of this replica's own, never stored) has no record to read: its
// absence is no end, and a reset of the copies (a reload's new store, a
// listening connection that reconnected) leaves it alone.
func (m *Sessions) reload(ctx context.Context, s *Session) error {
	s.mu.Lock()
	unstored := s.started && !s.stored
	s.mu.Unlock()
	if unstored {
		return nil
	}
	c := m.cfg()
	changes := s.changeCount()
	rec, catalog, err := m.read(ctx, c, s.Ref)
	if errors.Is(err, mcpstate.ErrNotFound) {
		m.endedElsewhere(c, s)
		return ErrClosed
	}
	if err != nil {
		return err
	}
	s.apply(rec, catalog, changes, nil, now().Sub(rec.Created) < listingWait)
	return nil
}

// Refresh reads s's record again: another replica changed it (its
// upstream session was re-initialized there) and this copy has not heard
// yet. ErrClosed when the session has ended.
func (s *Session) Refresh(ctx context.Context) error { return s.m.reload(ctx, s) }

// endedElsewhere closes this replica's copy of s, which another replica
// ended (its record is gone), handing s to the end hook when a transport
// module here holds an upstream session of it.
func (m *Sessions) endedElsewhere(c *Config, s *Session) {
	if m.closeLocal(s) && s.heldHere.Load() && c.OnEnd != nil {
		c.OnEnd(Ended{ID: s.ID, User: s.User, Service: s.Service, Upstream: s.Upstream(), Elsewhere: true})
	}
}

// reloadLater reads s's record again in the background, unless too many
// reads are in flight already (then the next use, or housekeeping, does).
func (m *Sessions) reloadLater(s *Session) {
	select {
	case m.reloads <- struct{}{}:
	default:
		return
	}
	started := m.goBackground(func() {
		defer func() { <-m.reloads }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = m.reload(ctx, s)
	})
	if !started {
		<-m.reloads
	}
}

// goBackground runs fn on a goroutine of its own that Destruct waits for,
// unless Destruct has begun: then it runs nothing and returns false. (A
// call on a retired session that ends after Destruct would otherwise
// start a storage write that outlives the configuration, and Add the
// WaitGroup while Destruct waits on it.)
func (m *Sessions) goBackground(fn func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return false
	}
	m.background.Go(fn)
	return true
}

// changed takes an announced change under the MCP session prefix.
func (m *Sessions) changed(c *Config, ch storecache.Change) {
	if m.cfg() != c {
		return // a configuration no longer in force
	}
	if ch.Reset {
		m.seq.Add(1)
		for _, s := range m.snapshot() {
			s.invalidate()
			if s.inUse.Load() > 0 || s.awaitingListing() || s.heldHere.Load() {
				m.reloadLater(s) // what is not read now, Housekeep reads
			}
		}
		return
	}
	kind, ref, window := mcpstate.ParseChange(ch.Key)
	switch kind {
	case mcpstate.SessionChange:
		m.seq.Add(1)
		s := m.lookup(ref)
		if s == nil {
			return
		}
		if ch.Local && s.own.Load() > 0 {
			s.own.Add(-1)
			return
		}
		s.invalidate()
		if s.inUse.Load() > 0 || s.awaitingListing() || s.heldHere.Load() {
			// In use, or holding what only this replica can end (a
			// transport module's session): an end elsewhere stops it now.
			m.reloadLater(s)
		}
	case mcpstate.SessionMarked:
		if s := m.lookup(ref); s != nil {
			for {
				known := s.marked.Load()
				if window <= known || s.marked.CompareAndSwap(known, window) {
					break
				}
			}
		}
	}
}

func (s *Session) awaitingListing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.catalogPending != nil
}

func (m *Sessions) lookup(ref string) *Session {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sessions[ref]
}

func (m *Sessions) snapshot() []*Session {
	m.mu.Lock()
	defer m.mu.Unlock()
	all := make([]*Session, 0, len(m.sessions))
	for _, s := range m.sessions {
		all = append(all, s)
	}
	return all
}

// Create starts a new MCP session for user in the toolgate session
// toolgateSession (which expires at expires, and the MCP session with it),
// or fails with an *LimitError (or, when the storage cannot
// count the caller's sessions, an error wrapping ErrStorageUnavailable).
// The session exists for other replicas once SetUpstream stored it; until
// then it holds a slot of its caller's on every replica, which End frees
// if the initialize fails. Its first tool listing counts as pending (see
// WaitCatalog).
func (m *Sessions) Create(ctx context.Context, user, toolgateSession string, expires time.Time, service string) (*Session, error) {
	return m.create(ctx, user, toolgateSession, expires, service, false)
}

// CreateLocal starts an MCP session that only this replica uses and that
// is never stored: the one toolgate implies for stateless requests, which
// carry everything any replica needs, so each replica implies its own. It
// counts against the same limits as Create, ends when idle here, and is
// never found by its id.
func (m *Sessions) CreateLocal(ctx context.Context, user, toolgateSession string, expires time.Time, service string) (*Session, error) {
	return m.create(ctx, user, toolgateSession, expires, service, true)
}

func (m *Sessions) create(ctx context.Context, user, toolgateSession string, expires time.Time, service string, local bool) (*Session, error) {
	c := m.cfg()
	if c == nil {
		return nil, errNotAttached
	}
	m.mu.Lock()
	if m.started >= c.Max {
		m.mu.Unlock()
		return nil, &LimitError{Option: "max_mcp_sessions", Limit: c.Max}
	}
	m.started++
	m.mu.Unlock()
	release := func() {
		m.mu.Lock()
		m.started--
		m.mu.Unlock()
	}
	// Counted and reserved under the caller's lock, on every replica:
	// initializes in flight at once must not all see room for one.
	ref := mcpstate.NewRef()
	var reserved *mcpstate.Store
	err := m.callerLocked(ctx, c, user, func() error {
		n, err := m.countCaller(ctx, c, user, "")
		if err != nil {
			return err
		}
		if n >= c.PerCaller {
			return &LimitError{Option: "max_mcp_sessions_per_caller", Limit: c.PerCaller}
		}
		if local { // held here only, and counted on every replica through this replica's record
			m.mu.Lock()
			m.localUser[user]++
			n := m.localUser[user]
			m.mu.Unlock()
			if err := m.storeHeld(ctx, c, user, n); err != nil {
				m.mu.Lock()
				if m.localUser[user]--; m.localUser[user] <= 0 {
					delete(m.localUser, user)
				}
				m.mu.Unlock()
				return err
			}
			return nil
		}
		if err := reserve(ctx, c.State.Storage(), user, ref); err != nil {
			return err
		}
		reserved = c.State
		return nil
	})
	if err != nil {
		release()
		return nil, err
	}
	if longest := now().Add(c.State.MaxAge()); expires.IsZero() || expires.After(longest) {
		expires = longest // an implied session has no expiry of its own
	}
	claims := mcpstate.ID{Ref: ref, Expires: expires, Owner: mcpstate.Owner(user, toolgateSession), Service: service, Session: toolgateSession}
	ctx2, cancel := context.WithCancel(context.Background())
	s := &Session{ID: mcpstate.Seal(c.Keys, claims), Ref: claims.Ref, User: user, SessionID: toolgateSession, Service: service, Created: now(),
		Expires: claims.Expires, m: m, started: true, local: local, ctx: ctx2, cancel: cancel, reinit: make(chan struct{}, 1),
		catalogPending: make(chan struct{}), reserved: reserved}
	if local { // only this replica's own sessions are retired (Retire)
		s.retiring, s.retireNow = context.WithCancel(ctx2)
	}
	s.checked.Store(now().UnixNano())
	s.Touch()
	m.mu.Lock()
	m.sessions[s.Ref] = s
	m.mu.Unlock()
	return s, nil
}

// End ends the session everywhere: its shared record is deleted and every
// replica is told (End returns once the announcement went out to them), so
// that the next request on any replica gets 404. It returns the upstream
// state to end upstream, and whether this call ended it (false when it had
// ended already). A storage failure changes nothing and is an error
// wrapping ErrStorageUnavailable.
func (m *Sessions) End(ctx context.Context, s *Session) (Upstream, bool, error) {
	s.mu.Lock()
	stored := s.stored
	s.mu.Unlock()
	if !stored {
		up := s.Upstream()
		ok := m.closeLocal(s)
		if !s.local {
			up = Upstream{} // initialize did not complete: its caller ends what it made
		}
		return up, ok, nil
	}
	rec, err := m.state().End(ctx, s.Ref, true)
	switch {
	case errors.Is(err, mcpstate.ErrNotFound):
		m.closeLocal(s)
		return Upstream{}, false, nil
	case err != nil:
		return Upstream{}, false, fmt.Errorf("%w: %v", ErrStorageUnavailable, err)
	}
	m.closeLocal(s)
	return upstreamOf(rec), true, nil
}

func upstreamOf(rec *mcpstate.Record) Upstream {
	return Upstream{SessionID: rec.Upstream.SessionID, ProtocolVersion: rec.Upstream.ProtocolVersion,
		InitializeParams: rec.Initialize, Generation: rec.Upstream.Generation, Endpoint: rec.Upstream.Endpoint, Grant: rec.Upstream.Grant}
}

// Retire ends s, a session of this replica's own (CreateLocal) that is
// replaced: at once when nothing uses it, else as soon as the calls in
// progress on it end — the replacement serves what comes next. Its
// listens, which would use it for as long as their runner keeps them
// open, end at once (Session.Retiring). Its upstream session goes to the
// end hook (Config.OnEnd), which knows that it was opened through a
// connection that is not the caller's any more: a DELETE carrying the
// new connection's credential with the old one's session is not sent (the
// upstream forgets it at its own idle timeout), but a transport module's
// session ends.
func (m *Sessions) Retire(s *Session) {
	if !s.local {
		return
	}
	s.retired.Store(true)
	s.retireNow() // its listens end now: they would use it for as long as the runner keeps them
	if s.inUse.Load() == 0 {
		m.retire(s)
	}
}

// RetireUnopened retires s, a local session, when it was never opened (no
// upstream session) and nothing uses it: it would only hold its caller's
// place among their MCP sessions. A session a request is using is left to
// it.
func (m *Sessions) RetireUnopened(s *Session) {
	if s.local && s.inUse.Load() == 0 && s.Upstream().Generation == 0 {
		m.Retire(s)
	}
}

// retire ends a retired session that nothing uses any more.
func (m *Sessions) retire(s *Session) {
	if m.closeLocal(s) {
		if c := m.cfg(); c.OnEnd != nil {
			c.OnEnd(Ended{ID: s.ID, User: s.User, Service: s.Service, Upstream: s.Upstream()})
		}
	}
}

// closeLocal closes this replica's copy of s and forgets it.
func (m *Sessions) closeLocal(s *Session) bool {
	m.mu.Lock()
	held := m.sessions[s.Ref] == s
	if held {
		delete(m.sessions, s.Ref)
		if s.started {
			m.started--
		}
		if s.local {
			if m.localUser[s.User]--; m.localUser[s.User] <= 0 {
				delete(m.localUser, s.User)
			}
		}
	}
	m.mu.Unlock()
	if held && s.local && s.started { // else whoever forgot s (Destruct) wrote the count
		if c := m.cfg(); c != nil {
			m.releaseHeld(c, s.User)
		}
	}
	s.unreserve(context.Background()) // an initialize that failed or was abandoned frees its slot
	return s.close()
}

// renewHeld writes again the records of users' local sessions here.
func (m *Sessions) renewHeld(ctx context.Context, c *Config, users []string) {
	for _, user := range users {
		err := m.callerLocked(ctx, c, user, func() error {
			m.mu.Lock()
			n := m.localUser[user]
			m.mu.Unlock()
			return m.storeHeld(ctx, c, user, n)
		})
		if err != nil {
			c.Logger.Warn("renewing the record of a caller's MCP sessions held here failed; other replicas may count them no more once it runs out", zap.Error(err))
		}
	}
}

// Len returns the number of sessions this replica holds.
func (m *Sessions) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sessions)
}
