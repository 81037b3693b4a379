package gateway

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// withClock makes now return *t for the test's duration.
func withClock(t *testing.T, at *time.Time) {
	t.Helper()
	old := now
	now = func() time.Time { return *at }
	t.Cleanup(func() { now = old })
}

func TestMCPSessionsExpireOnlyIdleSessionsNotInUse(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	withClock(t, &clock)
	m := newMCPSessions()
	idle, _ := m.Create("alice", "s", "svc")
	streaming, _ := m.Create("alice", "s", "svc")
	if err := idle.SetUpstream(Upstream{SessionID: "up-idle"}); err != nil {
		t.Fatal(err)
	}
	endStream := streaming.Begin() // an open stream
	clock = clock.Add(2 * time.Hour)

	ended := m.expire(time.Hour)
	if len(ended) != 1 || ended[0].Session != idle || ended[0].Upstream.SessionID != "up-idle" {
		t.Fatalf("expired %+v, want only the idle session with its upstream state", ended)
	}
	if !idle.Closed() || idle.Context().Err() == nil {
		t.Error("an expired session is not closed")
	}
	if _, err := m.Get(idle.ID); !errors.Is(err, ErrMCPSessionNotFound) {
		t.Errorf("Get(expired) = %v", err)
	}
	if _, err := m.Get(streaming.ID); err != nil {
		t.Errorf("a session with an open stream expired: %v", err)
	}
	endStream() // the stream closes: use ends now, and counts from now
	if ended := m.expire(time.Hour); len(ended) != 0 {
		t.Errorf("a session used a moment ago expired: %+v", ended)
	}
	clock = clock.Add(2 * time.Hour)
	if ended := m.expire(time.Hour); len(ended) != 1 || ended[0].Session != streaming {
		t.Errorf("expired %+v, want the session whose stream closed", ended)
	}
	if m.Len() != 0 {
		t.Errorf("%d sessions left", m.Len())
	}
}

func TestClosedMCPSessionNeverReinitializes(t *testing.T) {
	m := newMCPSessions()
	s, _ := m.Create("alice", "s", "svc")
	_ = s.SetUpstream(Upstream{SessionID: "up-1"})
	gen := s.Upstream().Generation

	// Closed while a re-initialization runs: the new upstream session is
	// discarded, not kept.
	var discarded []string
	_, err := s.Reinitialize(context.Background(), gen, func(cur Upstream) (Upstream, error) {
		if up, ok := m.End(s); !ok || up.SessionID != "up-1" {
			t.Errorf("End = %+v, %v", up, ok)
		}
		return Upstream{SessionID: "up-2"}, nil
	}, func(up Upstream) { discarded = append(discarded, up.SessionID) })
	if !errors.Is(err, ErrMCPSessionClosed) || len(discarded) != 1 || discarded[0] != "up-2" {
		t.Fatalf("Reinitialize racing End: err %v, discarded %v", err, discarded)
	}
	// Closed before: init never runs.
	_, err = s.Reinitialize(context.Background(), gen, func(cur Upstream) (Upstream, error) {
		t.Error("a closed session re-initialized")
		return cur, nil
	}, func(Upstream) {})
	if !errors.Is(err, ErrMCPSessionClosed) {
		t.Errorf("Reinitialize after End: %v", err)
	}
	if _, ok := m.End(s); ok {
		t.Error("a session was ended twice")
	}
}

func TestReinitializeWaitHonoursTheContext(t *testing.T) {
	m := newMCPSessions()
	s, _ := m.Create("alice", "s", "svc")
	started, release := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = s.Reinitialize(context.Background(), 0, func(cur Upstream) (Upstream, error) {
			close(started)
			<-release
			return Upstream{SessionID: "up"}, nil
		}, func(Upstream) {})
	}()
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Reinitialize(ctx, 0, func(cur Upstream) (Upstream, error) {
		t.Error("ran while another re-initialization held the lock")
		return cur, nil
	}, func(Upstream) {}); !errors.Is(err, context.Canceled) {
		t.Errorf("waiting with a cancelled context: %v", err)
	}
	close(release)
}

func TestMCPSessionLimitsPerCallerAndInAll(t *testing.T) {
	m := newMCPSessions()
	m.setLimits(3, 2)
	a1, _ := m.Create("alice", "s", "svc")
	if _, err := m.Create("alice", "s", "svc"); err != nil {
		t.Fatal(err)
	}
	var limit *MCPSessionLimitError
	if _, err := m.Create("alice", "s", "svc"); !errors.As(err, &limit) || limit.Option != "max_mcp_sessions_per_caller" {
		t.Errorf("alice's third: %v", err)
	}
	if _, err := m.Create("bob", "s", "svc"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create("carol", "s", "svc"); !errors.As(err, &limit) || limit.Option != "max_mcp_sessions" {
		t.Errorf("the fourth in all: %v", err)
	}
	m.End(a1)
	m.End(a1) // twice changes nothing
	if _, err := m.Create("alice", "s", "svc"); err != nil {
		t.Errorf("after an end: %v", err)
	}
	if _, err := m.Create("carol", "s", "svc"); err == nil {
		t.Error("ending one session twice made room for two")
	}
}

// A runner's answer matches the pending server→client request whatever the
// spelling of its id; an answer to nothing pending matches nothing.
func TestServerRequestsMatchOnTheIDsValue(t *testing.T) {
	m := newMCPSessions()
	s, _ := m.Create("alice", "s", "svc")
	if !s.ServerRequestSent([]byte(`"e1"`), "elicitation/create") || !s.ServerRequestSent([]byte(`7`), "sampling/createMessage") {
		t.Fatal("not recorded")
	}
	if method, ok := s.ServerRequestAnswered([]byte(`"e\u0031"`)); !ok || method != "elicitation/create" {
		t.Errorf(`"e\u0031" answers %q, %v`, method, ok)
	}
	if _, ok := s.ServerRequestAnswered([]byte(`"e1"`)); ok {
		t.Error("an answered request is still pending")
	}
	if _, ok := s.ServerRequestAnswered([]byte(`"7"`)); ok {
		t.Error(`the string "7" answered the integer 7`)
	}
	if method, ok := s.ServerRequestAnswered([]byte(`7`)); !ok || method != "sampling/createMessage" {
		t.Errorf("7 answers %q, %v", method, ok)
	}
	for i := range MaxPendingServerRequests {
		s.ServerRequestSent([]byte{'1', byte('0' + i%10), byte('0' + i/10%10), byte('0' + i/100)}, "roots/list")
	}
	if s.ServerRequestSent([]byte(`"one-too-many"`), "roots/list") {
		t.Error("more pending server requests than the bound")
	}
}

func TestWaitCatalog(t *testing.T) {
	m := newMCPSessions()
	s, _ := m.Create("alice", "s", "svc")
	// The first listing is pending from the start.
	go func() {
		time.Sleep(20 * time.Millisecond)
		s.CatalogListed(map[string]*ToolDefinition{"echo": {Name: "echo"}})
	}()
	if !s.WaitCatalog(context.Background(), 10*time.Second) || s.Tool("echo") == nil {
		t.Fatal("the call did not get the listed tools")
	}
	// A refresh: waiters wait again; a failed one keeps the old catalog.
	if !s.ListingTools() || s.ListingTools() {
		t.Fatal("ListingTools does not report a listing already pending")
	}
	s.CatalogFailed()
	if !s.WaitCatalog(context.Background(), time.Millisecond) || s.Tool("echo") == nil {
		t.Error("a failed refresh lost the catalog")
	}
	// A runner that never sends notifications/initialized waits once.
	other, _ := m.Create("alice", "s", "svc")
	if other.WaitCatalog(context.Background(), 10*time.Millisecond) {
		t.Error("a catalog that was never listed is known")
	}
	other.mu.Lock()
	pending := other.catalogPending
	other.mu.Unlock()
	if pending != nil {
		t.Error("after one wait ran out, later calls would wait again for a listing that never started")
	}
}

func TestProvisionStepChecksThePipelineOrder(t *testing.T) {
	for name, c := range map[string]struct {
		steps []Step
		bad   int // index of the first step refused; -1 for none
	}{
		"the documented order":       {[]Step{StepSession, StepRegistry, StepPolicy, StepCredentials, StepResultPolicy, StepProxy}, -1},
		"two branches of proxies":    {[]Step{StepSession, StepRegistry, StepProxy, StepProxy}, -1},
		"two routes":                 {[]Step{StepSession, StepRegistry, StepProxy, StepSession, StepRegistry, StepProxy}, -1},
		"nothing before the proxy":   {[]Step{StepProxy}, 0},
		"no registry":                {[]Step{StepSession, StepPolicy}, 1},
		"result policy after proxy":  {[]Step{StepSession, StepRegistry, StepProxy, StepResultPolicy}, 3},
		"a route without a session":  {[]Step{StepSession, StepRegistry, StepProxy, StepRegistry, StepProxy}, 3},
		"federation":                 {[]Step{StepSession, StepFederation, StepRegistry, StepPolicy, StepProxy}, -1},
		"federation after registry":  {[]Step{StepSession, StepRegistry, StepFederation, StepProxy}, 2},
		"federation without session": {[]Step{StepFederation, StepRegistry}, 0},
	} {
		a := &App{pipeline: new(pipelineTrail)}
		bad := -1
		for i, s := range c.steps {
			if err := a.ProvisionStep(s); err != nil {
				bad = i
				break
			}
		}
		if bad != c.bad {
			t.Errorf("%s: refused step %d, want %d", name, bad, c.bad)
		}
	}
}

// A session remembers the calls its tasks were created by, within bounds:
// beyond them the oldest are forgotten, never the one just created.
func TestMCPSessionTasks(t *testing.T) {
	m := newMCPSessions()
	s, _ := m.Create("alice", "s", "svc")
	args := []byte(`{"q":1}`)
	s.TaskCreated("t1", Task{Tool: "build", Arguments: args})
	args[2] = 'x' // the caller's memory is not kept
	if got, ok := s.Task("t1"); !ok || got.Tool != "build" || string(got.Arguments) != `{"q":1}` {
		t.Fatalf("Task(t1) = %+v, %v", got, ok)
	}
	// An upstream naming a known task again cannot move it to another call.
	s.TaskCreated("t1", Task{Tool: "delete_all"})
	if got, _ := s.Task("t1"); got.Tool != "build" {
		t.Errorf("t1 now belongs to %q", got.Tool)
	}
	if _, ok := s.Task("t2"); ok {
		t.Error("an unknown task is known")
	}
	for i := range MaxTasks {
		s.TaskCreated(fmt.Sprint("n", i), Task{Tool: "build"})
	}
	if _, ok := s.Task("t1"); ok {
		t.Error("the oldest task was kept beyond MaxTasks")
	}
	if _, ok := s.Task(fmt.Sprint("n", MaxTasks-1)); !ok {
		t.Error("the newest task was forgotten")
	}
	big := make([]byte, MaxTaskArguments/2+1)
	s.TaskCreated("big1", Task{Tool: "build", Arguments: big})
	s.TaskCreated("big2", Task{Tool: "build", Arguments: big})
	if _, ok := s.Task("big1"); ok {
		t.Error("tasks keep more than MaxTaskArguments bytes of arguments")
	}
	if _, ok := s.Task("big2"); !ok {
		t.Error("the task just created was forgotten")
	}
	m.End(s)
	s.TaskCreated("late", Task{Tool: "build"})
	if _, ok := s.Task("late"); ok {
		t.Error("an ended session remembers a task")
	}
}
