package mcpsession

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpstate"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/written"
)

// withClock makes now return *t for the test's duration.
func withClock(t *testing.T, at *time.Time) {
	t.Helper()
	old := now
	now = func() time.Time { return *at }
	t.Cleanup(func() { now = old })
}

// replicaOf returns MCP sessions as one gateway process holds them, on
// storage (shared with other replicas when the same storage is given),
// with the given idle timeout and bounds.
func replicaOf(t *testing.T, storage certmagic.Storage, idle time.Duration, max, perCaller int) (*Sessions, *[]Ended) {
	t.Helper()
	m := New()
	var ended []Ended
	c := &Config{State: mcpstate.New(storage, idle, 12*time.Hour, func() time.Time { return now() }),
		Keys: testKeys(t), Max: max, PerCaller: perCaller, CacheTTL: 10 * time.Second, Idle: idle,
		Logger: zap.NewNop(), OnEnd: func(e Ended) { ended = append(ended, e) }}
	if err := m.Attach(c); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Detach(c); _ = m.Destruct() })
	return m, &ended
}

func testKeys(t *testing.T) *seal.Keyring {
	k, err := seal.New(mcpstate.Purpose, []byte("test-state-secret-0123456789-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newMCP(t *testing.T) *Sessions {
	t.Helper()
	m, _ := replicaOf(t, &certmagic.FileStorage{Path: t.TempDir()}, time.Hour, 100, 100)
	return m
}

// toolgateSession is the toolgate session an MCP session is created in.
type toolgateSession struct {
	ID, User  string
	ExpiresAt time.Time
}

var aliceSession = &toolgateSession{ID: "s", User: "alice", ExpiresAt: time.Now().Add(time.Hour)}

// started creates a session and stores it as initialized upstream.
func started(t *testing.T, m *Sessions, sess *toolgateSession, upstreamID string) *Session {
	t.Helper()
	s, err := m.Create(context.Background(), sess.User, sess.ID, sess.ExpiresAt, "svc")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetUpstream(context.Background(), Upstream{SessionID: upstreamID, ProtocolVersion: "2025-11-25", InitializeParams: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMCPSessionsExpireOnlyIdleSessionsNotInUse(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	withClock(t, &clock)
	m, ended := replicaOf(t, &certmagic.FileStorage{Path: t.TempDir()}, time.Hour, 100, 100)
	sess := &toolgateSession{ID: "s", User: "alice", ExpiresAt: clock.Add(12 * time.Hour)}
	idle := started(t, m, sess, "up-idle")
	streaming := started(t, m, sess, "up-streaming")
	endStream := streaming.Begin() // an open stream
	clock = clock.Add(2 * time.Hour)

	m.Housekeep(context.Background())
	if len(*ended) != 1 || (*ended)[0].Upstream.SessionID != "up-idle" || (*ended)[0].User != "alice" {
		t.Fatalf("expired %+v, want only the idle session with its upstream state", *ended)
	}
	if !idle.Closed() || idle.Context().Err() == nil {
		t.Error("an expired session is not closed")
	}
	if _, err := m.Open(context.Background(), idle.ID, "alice", "s"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open(expired) = %v", err)
	}
	if _, err := m.Open(context.Background(), streaming.ID, "alice", "s"); err != nil {
		t.Errorf("a session with an open stream expired: %v", err)
	}
	endStream() // the stream closes: use ends now, and counts from now
	m.Housekeep(context.Background())
	if len(*ended) != 1 {
		t.Errorf("a session used a moment ago expired: %+v", *ended)
	}
	clock = clock.Add(2 * time.Hour)
	m.Housekeep(context.Background())
	if len(*ended) != 2 || (*ended)[1].Upstream.SessionID != "up-streaming" {
		t.Errorf("expired %+v, want the session whose stream closed", *ended)
	}
	if m.Len() != 0 {
		t.Errorf("%d sessions left", m.Len())
	}
}

func TestClosedMCPSessionNeverReinitializes(t *testing.T) {
	m := newMCP(t)
	s := started(t, m, aliceSession, "up-1")
	gen := s.Upstream().Generation

	// Closed while a re-initialization runs: the new upstream session is
	// discarded, not kept.
	var discarded []string
	_, err := s.Reinitialize(context.Background(), gen, func(cur Upstream) (Upstream, error) {
		if up, ok, err := m.End(context.Background(), s); !ok || err != nil || up.SessionID != "up-1" {
			t.Errorf("End = %+v, %v, %v", up, ok, err)
		}
		return Upstream{SessionID: "up-2"}, nil
	}, func(up Upstream) { discarded = append(discarded, up.SessionID) })
	if !errors.Is(err, ErrClosed) || len(discarded) != 1 || discarded[0] != "up-2" {
		t.Fatalf("Reinitialize racing End: err %v, discarded %v", err, discarded)
	}
	// Closed before: init never runs.
	_, err = s.Reinitialize(context.Background(), gen, func(cur Upstream) (Upstream, error) {
		t.Error("a closed session re-initialized")
		return cur, nil
	}, func(Upstream) {})
	if !errors.Is(err, ErrClosed) {
		t.Errorf("Reinitialize after End: %v", err)
	}
	if _, ok, _ := m.End(context.Background(), s); ok {
		t.Error("a session was ended twice")
	}

	// Closed here only while a re-initialization runs (retired on this
	// replica, its record kept): the record takes the new upstream session,
	// the copy here is closed, and the new upstream session is discarded
	// all the same, not left running with no one to end it.
	other := started(t, m, aliceSession, "up-3")
	discarded = nil
	_, err = other.Reinitialize(context.Background(), other.Upstream().Generation, func(cur Upstream) (Upstream, error) {
		m.closeLocal(other)
		return Upstream{SessionID: "up-4"}, nil
	}, func(up Upstream) { discarded = append(discarded, up.SessionID) })
	if !errors.Is(err, ErrClosed) || len(discarded) != 1 || discarded[0] != "up-4" {
		t.Errorf("Reinitialize of a session closed here meanwhile: err %v, discarded %v (want ErrClosed, up-4 discarded)", err, discarded)
	}
}

func TestReinitializeWaitHonoursTheContext(t *testing.T) {
	m := newMCP(t)
	s := started(t, m, aliceSession, "up")
	started, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		_, _ = s.Reinitialize(context.Background(), 1, func(cur Upstream) (Upstream, error) {
			close(started)
			<-release
			return Upstream{SessionID: "up"}, nil
		}, func(Upstream) {})
	}()
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Reinitialize(ctx, 1, func(cur Upstream) (Upstream, error) {
		t.Error("ran while another re-initialization held the lock")
		return cur, nil
	}, func(Upstream) {}); !errors.Is(err, context.Canceled) {
		t.Errorf("waiting with a cancelled context: %v", err)
	}
	close(release)
	<-done // it stores its result before the storage goes away
}

func TestMCPSessionLimitsPerCallerAndInAll(t *testing.T) {
	m, _ := replicaOf(t, &certmagic.FileStorage{Path: t.TempDir()}, time.Hour, 3, 2)
	ctx := context.Background()
	alice := &toolgateSession{ID: "a", User: "alice", ExpiresAt: time.Now().Add(time.Hour)}
	bob := &toolgateSession{ID: "b", User: "bob", ExpiresAt: time.Now().Add(time.Hour)}
	carol := &toolgateSession{ID: "c", User: "carol", ExpiresAt: time.Now().Add(time.Hour)}
	a1 := started(t, m, alice, "1")
	started(t, m, alice, "2")
	var limit *LimitError
	if _, err := m.Create(ctx, "alice", alice.ID, alice.ExpiresAt, "svc"); !errors.As(err, &limit) || limit.Option != "max_mcp_sessions_per_caller" {
		t.Errorf("alice's third: %v", err)
	}
	started(t, m, bob, "3")
	if _, err := m.Create(ctx, "carol", carol.ID, carol.ExpiresAt, "svc"); !errors.As(err, &limit) || limit.Option != "max_mcp_sessions" {
		t.Errorf("the fourth in all: %v", err)
	}
	_, _, _ = m.End(ctx, a1)
	_, _, _ = m.End(ctx, a1) // twice changes nothing
	started(t, m, alice, "4")
	if _, err := m.Create(ctx, "carol", carol.ID, carol.ExpiresAt, "svc"); err == nil {
		t.Error("ending one session twice made room for two")
	}
}

// The per-caller bound counts the caller's sessions on every replica.
func TestPerCallerLimitCountsEveryReplica(t *testing.T) {
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	a, _ := replicaOf(t, storage, time.Hour, 100, 2)
	b, _ := replicaOf(t, storage, time.Hour, 100, 2)
	started(t, a, aliceSession, "1")
	started(t, b, aliceSession, "2")
	var limit *LimitError
	if _, err := a.Create(context.Background(), "alice", aliceSession.ID, aliceSession.ExpiresAt, "svc"); !errors.As(err, &limit) {
		t.Errorf("alice's third, on either replica: %v", err)
	}
}

// An initialize holds its caller's slot on every replica until it is
// stored; one that fails frees it at once, one abandoned at its deadline.
func TestPerCallerSlotOfAnInitializeThatNeverStores(t *testing.T) {
	clock := time.Now()
	withClock(t, &clock)
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	a, _ := replicaOf(t, storage, time.Hour, 100, 1)
	b, _ := replicaOf(t, storage, time.Hour, 100, 1)
	ctx, cancel := context.WithDeadline(context.Background(), clock.Add(time.Minute)) // the initialize's
	defer cancel()
	failed, err := a.Create(ctx, "alice", aliceSession.ID, aliceSession.ExpiresAt, "svc")
	if err != nil {
		t.Fatal(err)
	}
	var limit *LimitError
	if _, err := b.Create(ctx, "alice", aliceSession.ID, aliceSession.ExpiresAt, "svc"); !errors.As(err, &limit) {
		t.Errorf("a second initialize while the first is in flight: %v", err)
	}
	_, _, _ = a.End(ctx, failed) // the upstream refused it
	abandoned, err := b.Create(ctx, "alice", aliceSession.ID, aliceSession.ExpiresAt, "svc")
	if err != nil {
		t.Fatalf("the slot of a failed initialize is still held: %v", err)
	}
	clock = clock.Add(time.Minute + written.Grace + time.Second) // b's initialize never came back
	s, err := a.Create(context.Background(), "alice", aliceSession.ID, aliceSession.ExpiresAt, "svc")
	if err != nil {
		t.Fatalf("the slot of an abandoned initialize is still held: %v", err)
	}
	if err := s.SetUpstream(context.Background(), Upstream{SessionID: "up", ProtocolVersion: "2025-11-25", InitializeParams: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Session{failed, abandoned, s} {
		if storage.Exists(ctx, reservationKey("alice", r.Ref)) {
			t.Errorf("a reservation is left: %s", r.Ref)
		}
	}
	if _, err := b.Create(ctx, "alice", aliceSession.ID, aliceSession.ExpiresAt, "svc"); !errors.As(err, &limit) {
		t.Errorf("a second session, the first stored: %v", err)
	}
}

// onTwoReplicas starts a session of alice's on one replica (m) and opens
// it on another sharing its storage.
func onTwoReplicas(t *testing.T) (m *Sessions, s, elsewhere *Session) {
	t.Helper()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	m, _ = replicaOf(t, storage, time.Hour, 100, 100)
	other, _ := replicaOf(t, storage, time.Hour, 100, 100)
	s = started(t, m, aliceSession, "up")
	elsewhere, err := other.Open(context.Background(), s.ID, "alice", "s")
	if err != nil {
		t.Fatal(err)
	}
	return m, s, elsewhere
}

// firstGeneration is the generation of a started session's upstream.
const firstGeneration = 1

// A runner's answer matches the pending server→client request whatever the
// spelling of its id, on whichever replica it arrives, and gives back the
// id the upstream sent the request with; an answer to nothing pending
// matches nothing.
func TestServerRequestsMatchOnTheIDsValue(t *testing.T) {
	_, s, elsewhere := onTwoReplicas(t)
	ctx := context.Background()
	e1, seven := s.ServerRequestID(firstGeneration, []byte(`"e1"`)), s.ServerRequestID(firstGeneration, []byte(`7`))
	if !s.ServerRequestSent(ctx, s.Upstream(), e1, []byte(`"e1"`), "elicitation/create") || !s.ServerRequestSent(ctx, s.Upstream(), seven, []byte(`7`), "sampling/createMessage") {
		t.Fatal("not recorded")
	}
	spelled := bytes.Replace(e1, []byte("toolgate"), []byte(`\u0074oolgate`), 1)
	if req, ok, err := elsewhere.ServerRequestAnswered(ctx, spelled); !ok || err != nil || req.Method != "elicitation/create" || string(req.ID) != `"e1"` {
		t.Errorf("%s answers %+v, %v, %v", spelled, req, ok, err)
	}
	if _, ok, _ := s.ServerRequestAnswered(ctx, e1); ok {
		t.Error("an answered request is still pending")
	}
	if _, ok, _ := s.ServerRequestAnswered(ctx, []byte(`7`)); ok {
		t.Error("the upstream's own id answered the request the runner knows by another")
	}
	if req, ok, _ := s.ServerRequestAnswered(ctx, seven); !ok || req.Method != "sampling/createMessage" || string(req.ID) != `7` {
		t.Errorf("%s answers %+v, %v", seven, req, ok)
	}
	for i := range MaxPendingServerRequests {
		id := []byte{'1', byte('0' + i%10), byte('0' + i/10%10), byte('0' + i/100)}
		s.ServerRequestSent(ctx, s.Upstream(), s.ServerRequestID(firstGeneration, id), id, "roots/list")
	}
	if s.ServerRequestSent(ctx, s.Upstream(), s.ServerRequestID(firstGeneration, []byte(`"one-too-many"`)), []byte(`"one-too-many"`), "roots/list") {
		t.Error("more pending server requests than the bound")
	}
}

// A request relayed here whose answer another replica took frees its
// place of MaxPendingServerRequests here too, once the bound is reached.
func TestServerRequestsAnsweredElsewhereFreeTheirPlaces(t *testing.T) {
	_, s, elsewhere := onTwoReplicas(t)
	ctx := context.Background()
	ask := func(i int) ([]byte, bool) {
		up := []byte(strconv.Itoa(i))
		id := s.ServerRequestID(firstGeneration, up)
		return id, s.ServerRequestSent(ctx, s.Upstream(), id, up, "roots/list")
	}
	var ids [][]byte
	for i := range MaxPendingServerRequests {
		id, ok := ask(i)
		if !ok {
			t.Fatalf("request %d refused", i)
		}
		ids = append(ids, id)
	}
	if _, ok := ask(MaxPendingServerRequests); ok {
		t.Fatal("more pending server requests than the bound")
	}
	for _, id := range ids[:10] {
		if _, ok, err := elsewhere.ServerRequestAnswered(ctx, id); !ok || err != nil {
			t.Fatalf("answering %s on another replica: %v, %v", id, ok, err)
		}
	}
	clock := time.Now().Add(2 * pendingRecount)
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = time.Now })
	for i := range 10 {
		if _, ok := ask(1000 + i); !ok {
			t.Fatalf("request %d refused with ten places freed on another replica", i)
		}
	}
	if _, ok := ask(2000); ok {
		t.Error("more pending server requests than the bound")
	}
}

// A re-initialized upstream starts its ids again: its request 1 is another
// than the one its predecessor asked under 1, and the runner knows the two
// apart; the pending request says which upstream session asked it.
func TestServerRequestIDsOfAReplacedUpstreamSessionDiffer(t *testing.T) {
	_, s, _ := onTwoReplicas(t)
	ctx := context.Background()
	gen, first := s.Upstream().Generation, s.Upstream().Ref()
	before := s.ServerRequestID(gen, []byte(`1`))
	if !s.ServerRequestSent(ctx, s.Upstream(), before, []byte(`1`), "elicitation/create") {
		t.Fatal("not recorded")
	}
	if _, err := s.Reinitialize(ctx, gen, func(cur Upstream) (Upstream, error) {
		return Upstream{SessionID: "up-2", ProtocolVersion: cur.ProtocolVersion}, nil
	}, func(Upstream) {}); err != nil {
		t.Fatal(err)
	}
	after := s.ServerRequestID(gen+1, []byte(`1`))
	if bytes.Equal(before, after) {
		t.Fatalf("request 1 of two upstream sessions is named %s alike", after)
	}
	// A request the replaced session asked on a stream still open is named
	// as that session's, not as the one now current.
	if late := s.ServerRequestID(gen, []byte(`1`)); !bytes.Equal(late, before) {
		t.Errorf("request 1 of the replaced session is named %s after the re-initialization, %s before", late, before)
	}
	if !s.ServerRequestSent(ctx, s.Upstream(), after, []byte(`1`), "roots/list") {
		t.Fatal("not recorded")
	}
	second := s.Upstream().Ref()
	if first == "" || first == second {
		t.Fatalf("the upstream sessions are named %q and %q", first, second)
	}
	for id, want := range map[string]struct {
		gen uint64
		ref string
	}{string(before): {gen, first}, string(after): {gen + 1, second}} {
		if req, ok, err := s.ServerRequestAnswered(ctx, []byte(id)); !ok || err != nil || req.Generation != want.gen || req.Upstream != want.ref {
			t.Errorf("%s answers %+v, %v, %v; want generation %d of upstream session %s", id, req, ok, err, want.gen, want.ref)
		}
	}
}

// The id the runner knows a server request by says nothing of the
// upstream's: the same on every replica and for every spelling of the
// upstream's id, another for another id or another MCP session.
func TestServerRequestIDIsToolgatesOwn(t *testing.T) {
	m, s, elsewhere := onTwoReplicas(t)
	second := started(t, m, aliceSession, "up")
	id := s.ServerRequestID(firstGeneration, []byte(`"secret-zq"`))
	if !bytes.HasPrefix(id, []byte(`"`+ServerRequestPrefix)) || bytes.Contains(id, []byte("secret")) || bytes.Contains(id, []byte("zq")) {
		t.Errorf("the runner's id %s", id)
	}
	for what, same := range map[string][]byte{
		"another replica":  elsewhere.ServerRequestID(firstGeneration, []byte(`"secret-zq"`)),
		"another spelling": s.ServerRequestID(firstGeneration, []byte(`"secret-\u007aq"`)),
	} {
		if !bytes.Equal(same, id) {
			t.Errorf("%s names the request %s, not %s", what, same, id)
		}
	}
	for what, differs := range map[string][]byte{
		"another id":          s.ServerRequestID(firstGeneration, []byte(`"secret-zy"`)),
		"another case":        s.ServerRequestID(firstGeneration, []byte(`"Secret-zq"`)),
		"another MCP session": second.ServerRequestID(firstGeneration, []byte(`"secret-zq"`)),
	} {
		if bytes.Equal(differs, id) {
			t.Errorf("%s is named %s too", what, id)
		}
	}
}

func TestWaitCatalog(t *testing.T) {
	m := newMCP(t)
	ctx := context.Background()
	s := started(t, m, aliceSession, "up")
	// The first listing is pending from the start.
	listed := make(chan struct{})
	go func() {
		defer close(listed)
		time.Sleep(20 * time.Millisecond)
		_ = s.CatalogListed(ctx, map[string][]byte{"echo": []byte(`{"name":"echo"}`)})
	}()
	ok := s.WaitCatalog(ctx, 10*time.Second) && s.Tool("echo") != nil
	<-listed // written to the test's storage before it is removed
	if !ok {
		t.Fatal("the call did not get the listed tools")
	}
	// A refresh: waiters wait again; a failed one keeps the old catalog.
	if !s.ListingTools() || s.ListingTools() {
		t.Fatal("ListingTools does not report a listing already pending")
	}
	s.CatalogFailed()
	if !s.WaitCatalog(ctx, time.Millisecond) || s.Tool("echo") == nil {
		t.Error("a failed refresh lost the catalog")
	}
	// A runner that never sends notifications/initialized waits once.
	other := started(t, m, aliceSession, "up-2")
	if other.WaitCatalog(ctx, 10*time.Millisecond) {
		t.Error("a catalog that was never listed is known")
	}
	other.mu.Lock()
	pending := other.catalogPending
	other.mu.Unlock()
	if pending != nil {
		t.Error("after one wait ran out, later calls would wait again for a listing that never started")
	}
}

// A listing under way here is not ended by reading the record, which
// still names the catalog listed before it (a storage without
// notifications is read while calls wait).
func TestStoredCatalogDoesNotEndAListingHere(t *testing.T) {
	m := newMCP(t)
	ctx := context.Background()
	s := started(t, m, aliceSession, "up")
	if err := s.CatalogListed(ctx, map[string][]byte{"echo": []byte(`{"name":"echo"}`)}); err != nil {
		t.Fatal(err)
	}
	if !s.ListingTools() {
		t.Fatal("no refresh started")
	}
	if err := m.reload(ctx, s); err != nil {
		t.Fatal(err)
	}
	if !s.awaitingListing() {
		t.Fatal("reading the stored record ended the listing under way here")
	}
	listed := make(chan struct{})
	go func() {
		defer close(listed)
		time.Sleep(20 * time.Millisecond)
		_ = s.CatalogListed(ctx, map[string][]byte{"echo": []byte(`{"name":"echo"}`), "late": []byte(`{"name":"late"}`)})
	}()
	if !s.WaitCatalog(ctx, 10*time.Second) || s.Tool("late") == nil {
		t.Error("the call waiting for the refresh did not get its tools")
	}
	// The waiting call may go on before the record is written; the test's
	// storage directory is removed only once it is.
	<-listed
}

// A session implied for stateless requests is this replica's: nothing of
// it is stored but the count of such sessions the replica holds for the
// caller, no id opens it, it counts against the caller's bound on every
// replica, and idle here it ends, upstream too.
func TestLocalSessionsStayOnTheirReplica(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	withClock(t, &clock)
	dir := t.TempDir()
	storage := &certmagic.FileStorage{Path: dir}
	m, ended := replicaOf(t, storage, time.Hour, 100, 2)
	other, _ := replicaOf(t, storage, time.Hour, 100, 2)
	ctx := context.Background()
	sess := &toolgateSession{ID: "s", User: "alice", ExpiresAt: clock.Add(12 * time.Hour)}
	s, err := m.CreateLocal(ctx, "alice", sess.ID, sess.ExpiresAt, "svc")
	if err != nil {
		t.Fatal(err)
	}
	up, err := s.Reinitialize(ctx, 0, func(Upstream) (Upstream, error) {
		return Upstream{SessionID: "up-implied", ProtocolVersion: "2025-11-25"}, nil
	}, func(Upstream) { t.Error("discarded") })
	if err != nil || up.Generation != 1 || up.SessionID != "up-implied" {
		t.Fatalf("Reinitialize = %+v, %v", up, err)
	}
	if err := s.CatalogListed(ctx, map[string][]byte{"echo": []byte(`{"name":"echo"}`)}); err != nil || s.Tool("echo") == nil {
		t.Fatalf("CatalogListed: %v", err)
	}
	keys, _ := storage.List(ctx, mcpstate.Prefix, true)
	for _, k := range keys {
		if !strings.HasPrefix(k, initializingPrefix) || strings.Count(k, "/") == 4 && !strings.HasPrefix(path.Base(k), "held-") {
			t.Errorf("a local session stored %v", keys)
		}
	}
	for _, r := range []*Sessions{m, other} {
		if _, err := r.Open(ctx, s.ID, "alice", "s"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Open(local id) = %v", err)
		}
	}
	started(t, m, sess, "up-stored")
	var limit *LimitError
	if _, err := m.CreateLocal(ctx, "alice", sess.ID, sess.ExpiresAt, "svc"); !errors.As(err, &limit) {
		t.Errorf("a third session (one local, one stored) was allowed: %v", err)
	}
	if _, err := other.CreateLocal(ctx, "alice", sess.ID, sess.ExpiresAt, "svc"); !errors.As(err, &limit) {
		t.Errorf("a third session (one local on another replica, one stored) was allowed: %v", err)
	}
	clock = clock.Add(2 * time.Hour)
	m.Housekeep(ctx)
	var upstreams []string
	for _, e := range *ended {
		upstreams = append(upstreams, e.Upstream.SessionID)
	}
	if len(upstreams) != 2 || !s.Closed() {
		t.Errorf("idle sessions ended with upstreams %v (local closed: %v), want up-implied and up-stored", upstreams, s.Closed())
	}
	if _, err := m.CreateLocal(ctx, "alice", sess.ID, sess.ExpiresAt, "svc"); err != nil {
		t.Errorf("the ended local session still counts: %v", err)
	}
}

// A session remembers the calls its tasks were created by, within bounds:
// beyond them the oldest are forgotten, never the one just created; every
// replica knows them, until they are forgotten or the session ends.
func TestSessionTasks(t *testing.T) {
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	m, _ := replicaOf(t, storage, time.Hour, 100, 100)
	other, _ := replicaOf(t, storage, time.Hour, 100, 100)
	ctx := context.Background()
	s := started(t, m, aliceSession, "up")
	task := func(s *Session, id string) (Task, bool) {
		t.Helper()
		got, ok, err := s.Task(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return got, ok
	}
	args := []byte(`{"q":1}`)
	s.TaskCreated(ctx, "t1", Task{Tool: "build", Arguments: args})
	args[2] = 'x' // the caller's memory is not kept
	if got, ok := task(s, "t1"); !ok || got.Tool != "build" || string(got.Arguments) != `{"q":1}` {
		t.Fatalf("Task(t1) = %+v, %v", got, ok)
	}
	// An upstream naming a known task again cannot move it to another call.
	s.TaskCreated(ctx, "t1", Task{Tool: "delete_all"})
	if got, _ := task(s, "t1"); got.Tool != "build" {
		t.Errorf("t1 now belongs to %q", got.Tool)
	}
	if _, ok := task(s, "t2"); ok {
		t.Error("an unknown task is known")
	}
	// Another replica knows the task by its call, and nothing else.
	onOther, err := other.Open(ctx, s.ID, "alice", aliceSession.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := task(onOther, "t1"); !ok || got.Tool != "build" || string(got.Arguments) != `{"q":1}` {
		t.Errorf("t1 on the other replica = %+v, %v", got, ok)
	}
	if _, ok := task(onOther, "t2"); ok {
		t.Error("an unknown task is known on the other replica")
	}
	for i := range MaxTasks {
		s.TaskCreated(ctx, fmt.Sprint("n", i), Task{Tool: "build"})
	}
	if _, ok := task(s, "t1"); ok {
		t.Error("the oldest task was kept beyond MaxTasks")
	}
	if _, ok := task(s, fmt.Sprint("n", MaxTasks-1)); !ok {
		t.Error("the newest task was forgotten")
	}
	big := make([]byte, MaxTaskArguments/2+1)
	s.TaskCreated(ctx, "big1", Task{Tool: "build", Arguments: big})
	s.TaskCreated(ctx, "big2", Task{Tool: "build", Arguments: big})
	if _, ok := task(s, "big1"); ok {
		t.Error("tasks keep more than MaxTaskArguments bytes of arguments")
	}
	if _, ok := task(s, "big2"); !ok {
		t.Error("the task just created was forgotten")
	}
	if _, ok := task(onOther, "big1"); ok {
		t.Error("a task forgotten where it was created is still known elsewhere")
	}
	_, _, _ = m.End(context.Background(), s)
	s.TaskCreated(ctx, "late", Task{Tool: "build"})
	if _, ok := task(s, "late"); ok {
		t.Error("an ended session remembers a task")
	}
	if _, ok := task(onOther, "big2"); ok {
		t.Error("an ended session's task is known on the other replica")
	}
}

// An Mcp-Session-Id opens, on any replica, only for the caller and the
// toolgate session it was sealed for, only while it has not expired, and
// only as sealed under the gateway's secret: another caller or session is
// ErrForeign, anything altered, resealed under another secret or expired is
// ErrNotFound (404: initialize again), and none of it changes the session.
func TestOpenRefusesIDsNotSealedForTheCaller(t *testing.T) {
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	a, _ := replicaOf(t, storage, time.Hour, 100, 100)
	b, _ := replicaOf(t, storage, time.Hour, 100, 100)
	ctx := context.Background()
	s := started(t, a, aliceSession, "up")

	for name, c := range map[string]struct{ user, session string }{
		"bob in his own session":        {"bob", "b"},
		"bob in alice's session":        {"bob", aliceSession.ID},
		"bob naming no session":         {"bob", ""},
		"alice in another session":      {"alice", "other"},
		"a caller named like the owner": {"alices", ""},
	} {
		if _, err := b.Open(ctx, s.ID, c.user, c.session); !errors.Is(err, ErrForeign) {
			t.Errorf("%s: Open = %v, want ErrForeign", name, err)
		}
	}

	claims, err := mcpstate.Open(testKeys(t), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	other, err := seal.New(mcpstate.Purpose, []byte("another-state-secret-0123456789-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	claims.Owner = mcpstate.Owner("bob", "b")
	flipped := []byte(s.ID)
	flipped[len(flipped)/2] ^= 1
	for name, id := range map[string]string{
		"one bit flipped":                  string(flipped),
		"truncated":                        s.ID[:len(s.ID)-4],
		"empty":                            "",
		"sealed for bob elsewhere":         mcpstate.Seal(other, claims),
		"forged for alice, another secret": mcpstate.Seal(other, mcpstate.ID{Ref: mcpstate.NewRef(), Expires: s.Expires, Owner: mcpstate.Owner("alice", aliceSession.ID), Service: "svc", Session: aliceSession.ID}),
	} {
		if _, err := b.Open(ctx, id, "bob", "b"); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s, by bob: Open = %v, want ErrNotFound", name, err)
		}
		if _, err := b.Open(ctx, id, "alice", aliceSession.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s, by alice: Open = %v, want ErrNotFound", name, err)
		}
	}

	// Nothing of that changed the session: alice continues it on b.
	got, err := b.Open(ctx, s.ID, "alice", aliceSession.ID)
	if err != nil || got.Upstream().SessionID != "up" {
		t.Fatalf("alice on b: %v %+v", err, got)
	}

	// Past its expiry the id opens for no one, on any replica.
	later := s.Expires.Add(time.Second)
	withClock(t, &later)
	for name, m := range map[string]*Sessions{"a": a, "b": b} {
		if _, err := m.Open(ctx, s.ID, "alice", aliceSession.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("expired, on %s: Open = %v, want ErrNotFound", name, err)
		}
	}
}

// Streams kept for resumption are findable while they are written; of
// those dropped, the session keeps the latest MaxResumableStreams and
// returns the ones it pushed out (never one written again since); an
// ended session keeps nothing.
func TestKeptStreamsCountOnlyWhenDropped(t *testing.T) {
	m := newMCP(t)
	s := started(t, m, aliceSession, "up-1")
	name := func(i int) string { return fmt.Sprintf("s%d", i) }
	for i := range MaxResumableStreams + 2 {
		if !s.KeepStream(name(i), i) {
			t.Fatalf("KeepStream(%s) refused in an open session", name(i))
		}
	}
	s.StreamResumed(name(0)) // never dropped: nothing to resume it from
	for i := 1; i <= MaxResumableStreams; i++ {
		if evicted := s.StreamDropped(name(i)); len(evicted) != 0 {
			t.Fatalf("dropping %s of %d pushed out %v", name(i), MaxResumableStreams, evicted)
		}
	}
	s.StreamDropped(name(1)) // dropped again after a resume: the latest now
	evicted := s.StreamDropped(name(MaxResumableStreams + 1))
	if len(evicted) != 1 || evicted[0] != 2 {
		t.Fatalf("the ninth dropped stream pushed out %v, want [2] (the oldest dropped)", evicted)
	}
	if s.Stream(name(0)) != 0 || s.Stream(name(1)) != 1 || s.Stream(name(2)) != nil {
		t.Errorf("findable: s0 %v, s1 %v, s2 %v; want 0, 1 and nothing", s.Stream(name(0)), s.Stream(name(1)), s.Stream(name(2)))
	}
	s.ForgetStream(name(1))
	if s.Stream(name(1)) != nil || len(s.StreamDropped(name(1))) != 0 {
		t.Error("a forgotten stream is still kept")
	}
	if _, ok, _ := m.End(context.Background(), s); !ok {
		t.Fatal("End failed")
	}
	if s.KeepStream("late", 1) || s.Stream(name(0)) != nil {
		t.Error("an ended session keeps streams")
	}
}

// The upstream a session was initialized with stays its upstream: a
// re-initialization (here or on another replica) keeps the endpoint the
// first initialize recorded, whatever init returns, and a replica that
// reads the session from storage sees it too.
func TestMCPSessionKeepsItsEndpoint(t *testing.T) {
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	a, _ := replicaOf(t, storage, time.Hour, 100, 100)
	b, _ := replicaOf(t, storage, time.Hour, 100, 100)
	s, err := a.Create(context.Background(), "alice", "s", time.Now().Add(time.Hour), "svc")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetUpstream(context.Background(), Upstream{SessionID: "up-1", ProtocolVersion: "2025-11-25", InitializeParams: []byte(`{}`), Endpoint: "old"}); err != nil {
		t.Fatal(err)
	}
	up, err := s.Reinitialize(context.Background(), s.Upstream().Generation, func(Upstream) (Upstream, error) {
		return Upstream{SessionID: "up-2", ProtocolVersion: "2025-11-25", Endpoint: "new"}, nil
	}, func(Upstream) {})
	if err != nil || up.SessionID != "up-2" || up.Endpoint != "old" || s.Upstream().Endpoint != "old" {
		t.Fatalf("after re-initializing: %+v (held %+v), %v; want the endpoint of the first initialize", up, s.Upstream(), err)
	}
	other, err := b.Open(context.Background(), s.ID, "alice", "s")
	if err != nil {
		t.Fatal(err)
	}
	if got := other.Upstream(); got.Endpoint != "old" || !got.From("old") || got.From("new") {
		t.Errorf("another replica reads %+v: want endpoint old, from old and not from new", got)
	}
	if !(Upstream{}).From("any") {
		t.Error("a session that recorded no endpoint (an older version's) is taken for another upstream's")
	}
}

// A session another replica ended goes to this replica's end hook,
// marked Elsewhere, only when a transport module here holds an upstream
// session of it (HeldHere): an HTTP upstream's session was ended by the
// replica that ended it, and must not get a second DELETE from each
// replica that served it.
func TestEndedElsewhereReachesTheHookOnlyWhenHeldHere(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	withClock(t, &clock)
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	a, _ := replicaOf(t, storage, time.Hour, 100, 100)
	b, endedB := replicaOf(t, storage, time.Hour, 100, 100)
	held := started(t, a, aliceSession, "up-held")
	plain := started(t, a, aliceSession, "up-plain")
	for _, s := range []*Session{held, plain} {
		copyB, err := b.Open(context.Background(), s.ID, "alice", "s")
		if err != nil {
			t.Fatal(err)
		}
		if s == held {
			copyB.HeldHere()
		}
		if _, _, err := a.End(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	clock = clock.Add(time.Minute) // past cache_ttl: b reads the records again (file storage announces nothing)
	for _, s := range []*Session{held, plain} {
		if _, err := b.Open(context.Background(), s.ID, "alice", "s"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Open through b of a session ended through a: %v", err)
		}
	}
	if len(*endedB) != 1 || !(*endedB)[0].Elsewhere || (*endedB)[0].Upstream.SessionID != "up-held" {
		t.Errorf("b's end hook got %+v, want only the session held here, marked Elsewhere", *endedB)
	}
}
