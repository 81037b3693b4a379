package stdio

// Review of 95b3fab: a start takes its place in rt.procs as it is decided
// (startLocked, replaceLocked), and a runner's session whose credential
// changed winds down (mcpbridge Session.retire, reachableLocked) instead
// of being forgotten at once.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpbridge/bridgetest"
	"github.com/toolgate/toolgate/internal/stdioserver"
	"github.com/toolgate/toolgate/modules/gateway"
)

// envWinding puts this test binary in a program mode of this file's
// (checked in init, before TestMain).
const envWinding = "TOOLGATE_WINDING_PROGRAM"

func init() {
	if mode := os.Getenv(envWinding); mode != "" {
		windingProgram(mode)
		os.Exit(0)
	}
}

// windingProgram is an MCP server on stdin/stdout. slow-answer: a
// tools/call is answered "done" three seconds later, cancelled or not.
func windingProgram(mode string) {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		line := in.Bytes()
		id := gjson.GetBytes(line, "id").Raw
		switch gjson.GetBytes(line, "method").String() {
		case "initialize":
			fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"winding","version":"1"}}}`+"\n", id)
		case "tools/call":
			if mode == "slow-answer" {
				go func(id string) {
					time.Sleep(3 * time.Second)
					fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"done"}]}}`+"\n", id)
				}(id)
			}
		}
	}
}

// namedSession is toolgate_proxy's side of a transport module: every
// request names the runner's MCP session by its storage name
// (gateway.WithUpstreamSession, modules/mcpproxy/upstream.go:120), the
// same before and after a re-initialize.
type namedSession struct {
	rt  http.RoundTripper
	ref string
}

func (n namedSession) RoundTrip(r *http.Request) (*http.Response, error) {
	return n.rt.RoundTrip(r.WithContext(gateway.WithUpstreamSession(r.Context(), n.ref)))
}

// Attack (fixed): the path toolgate_proxy takes on a credential change. per_user
// with credential_env; alice's tool call is in progress (the program
// answers it 3 s later) when her token is refreshed. Her runner's next
// request carries the new token: the bridge answers 404 (the session
// winds down), and toolgate_proxy re-initializes the upstream session
// (mcpproxy Handler.post → reinitialize), under the same name — the
// runner's MCP session's storage ref (gateway.UpstreamSession), which the
// stdio bridge uses as the session id. Expected (README "One process per
// service, or per user": "the old one stops once its requests are
// answered"; 68e6dee: a credential change lets calls in progress finish):
// the call gets its answer. Happens: since 95b3fab the winding session
// stays in the bridge's map (internal/mcpbridge/bridge.go:229-240), so
// Bridge.open (bridge.go:360-365) finds it under the same id as "the
// same MCP session's, initialized again here" and ends it
// (session.go end): the call is cancelled at the program and its
// runner's stream ends without an answer; the runner's answers to the
// call's server requests then reach the new session and are dropped.
// Before 95b3fab the session was forgotten at once and the call
// finished. Fix: in Bridge.open, a winding old session is not ended —
// keep winding sessions apart (a per-id list beside b.sessions, or keyed
// by id and link) and route the runner's answers and cancellations to
// the session that owns the server request or call they name.
//
// Fixed: Bridge.open keeps a winding session apart (Bridge.winding), and a
// runner's answer or cancellation goes to the session that awaits it
// (ownerOf).
func TestWindingReinitializeUnderSameNameEndsCallInProgress(t *testing.T) {
	s := testSpec(t, "")
	s.Env = append(s.Env, envWinding+"=slow-answer")
	s.StartTimeout = 5 * time.Second
	s.PerUser, s.CredEnv, s.CredHeader = true, "TOKEN", "Authorization"
	rt := startBounded(t, s)
	alice := &bridgetest.Runner{T: t, RT: namedSession{rt.bridge, "mcp-session-alice-1"}, User: "alice",
		Header: http.Header{"Authorization": {"Bearer alice-token-1"}}}
	alice.Initialize(bridgetest.NoCapabilities)
	answer := make(chan string, 1)
	go func() {
		resp := alice.Send(http.MethodPost, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","arguments":{}}}`)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answer <- string(b)
	}()
	waitFor(t, "alice's call is in progress", func() bool { busy, _ := rt.workers["alice"].busy(); return busy })

	alice.Header.Set("Authorization", "Bearer alice-token-2") // refreshed meanwhile
	resp := alice.Send(http.MethodPost, `{"jsonrpc":"2.0","id":8,"method":"tools/list"}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("control: a request with the new token on the old session: HTTP %d, want 404", resp.StatusCode)
	}
	alice.Initialize(bridgetest.NoCapabilities) // toolgate_proxy's reinitialize, same session name
	select {
	case b := <-answer:
		if !strings.Contains(b, "done") {
			t.Errorf("alice's call in progress ended without its answer when her runner re-initialized with the refreshed token: %q", b)
		}
	case <-time.After(8 * time.Second):
		t.Error("alice's call in progress got no answer")
	}
}

// Attack (fixed): per_user, max_processes 2. bob's program crashed and waits
// for its back-off restart (his worker holds a place: placesLocked counts
// it). alice has a call in progress when her token changes. Expected
// (README "One process per service, or per user": a replaced process is
// counted, and "when there is no room for it beside the new one it stops
// at once"; max_processes table row): at most 2 processes — alice's old
// one stops at once (bob's place is taken), or bob's restart waits.
// Happens: replaceLocked (supervisor.go:462) checks rt.procs, which
// counts only processes alive or starting — not bob's worker waiting in
// back-off — so alice's old process keeps running beside her new one, and
// worker.restart (supervisor.go:573-584) then starts bob's with no check
// at all: 3 processes. Fix: decide room with one count — the places
// (workers + retiring) that runtime.worker uses, kept as an atomic so
// replaceLocked can read it under w.mu — or make restart (and a start
// from stateStopped) wait while procs is at max_processes.
//
// Fixed: one atomic count of places (workers and retiring processes,
// rt.places), taken by adding and comparing, by runtime.worker and
// replaceLocked alike.
func TestWindingBackoffRestartGoesOverMaxProcesses(t *testing.T) {
	ft := useFakeTimers(t)
	s := testSpec(t, stdioserver.ModeServe)
	s.PerUser, s.CredEnv, s.CredHeader, s.MaxProcs = true, "TOKEN", "Authorization", 2
	rt := startBounded(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	alice := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice", Header: http.Header{"Authorization": {"Bearer alice-token-1"}}}
	alice.Initialize(bridgetest.NoCapabilities)
	aliceOld := who(t, alice).PID
	call := make(chan struct{})
	go func() {
		defer close(call)
		resp := alice.SendCtx(ctx, http.MethodPost, `{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"wait","arguments":{}}}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}()
	waitFor(t, "alice's call is in progress", func() bool { busy, _ := rt.workers["alice"].busy(); return busy })
	bob := &bridgetest.Runner{T: t, RT: rt.bridge, User: "bob", Header: http.Header{"Authorization": {"Bearer bob-token-1"}}}
	bob.Initialize(bridgetest.NoCapabilities)
	_ = syscall.Kill(who(t, bob).PID, syscall.SIGKILL) // bob's program crashes
	waitFor(t, "bob's worker waits to restart", func() bool { return rt.workerState("bob") == stateBackoff })

	alice2 := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice", Header: http.Header{"Authorization": {"Bearer alice-token-2"}}}
	alice2.Initialize(bridgetest.NoCapabilities)
	aliceNew := who(t, alice2).PID
	ft.fire(t) // bob's restart is due
	waitFor(t, "bob's program runs again", func() bool { return rt.workerState("bob") == stateRunning })
	bobNew := rt.startedPIDs()
	alive := 0
	for _, pid := range []int{aliceOld, aliceNew} {
		if syscall.Kill(pid, 0) == nil {
			alive++
		}
	}
	rt.mu.Lock()
	bw := rt.workers["bob"]
	rt.mu.Unlock()
	bw.mu.Lock()
	if bw.proc != nil && syscall.Kill(bw.proc.pid, 0) == nil {
		alive++
	}
	bw.mu.Unlock()
	if alive > s.MaxProcs {
		t.Errorf("%d processes alive on a service with max_processes %d (rt.procs %d; alice's old %d retiring beside her new %d, and bob's restarted; held: %v)",
			alive, s.MaxProcs, rt.procs.Load(), aliceOld, aliceNew, bobNew)
	}
	cancel()
	<-call
}

// Attack (fixed): a worker stopped (Destruct on a reload or shutdown, or its user
// disconnecting: stopGone) while its program is starting, when the start
// fails (fork/exec refused: EAGAIN under a process limit, a binary being
// replaced). The test plays worker.run's failure path (supervisor.go:
// 474-479: the place given back, then ended) after worker.stop, the order
// the race gives. Expected (README "Clean stops": on reload and shutdown
// toolgate stops the program, "nothing left"; a stopped worker is done
// with): the worker stays stopped and nothing starts again. Happens:
// endedLocked (supervisor.go:538-562) checks only w.started, which stop
// leaves as it was, so it overwrites stateClosed with stateBackoff and
// schedules a restart; restart (supervisor.go:573-584) finds stateBackoff
// and starts the program — after Destruct returned, held by a worker no
// runtime knows: never stopped, counted in rt.procs for good. Fix: in
// endedLocked, return at once when w.state == stateClosed (for p nil too).
//
// Fixed: endedLocked returns at once for a worker stopped for good.
func TestWindingStartFailureAfterStopRestartsTheProgram(t *testing.T) {
	ft := useFakeTimers(t)
	rt := startBounded(t, testSpec(t, stdioserver.ModeServe))
	started := make(chan struct{})
	w := &worker{rt: rt, key: "", retiring: map[*process]struct{}{}}
	rt.mu.Lock()
	rt.workers[""] = w
	rt.mu.Unlock()
	w.mu.Lock()
	w.state, w.started, w.lastUse = stateStarting, started, now() // startLocked's state, its run in startProcess
	w.mu.Unlock()
	rt.procs.Add(1) // startLocked's place

	if err := rt.Destruct(); err != nil { // a reload or shutdown meanwhile
		t.Fatal(err)
	}
	rt.procs.Add(-1) // run: startProcess failed (supervisor.go:476)
	w.ended(nil, started, "could not be started (fork/exec: resource temporarily unavailable)", "start_failed")

	ft.mu.Lock()
	scheduled := len(ft.pending)
	ft.mu.Unlock()
	if scheduled > 0 {
		ft.fire(t)
		time.Sleep(500 * time.Millisecond)
	}
	w.mu.Lock()
	st, proc := w.state, w.proc
	w.mu.Unlock()
	if scheduled > 0 || st != stateClosed || proc != nil {
		pid := 0
		if proc != nil {
			pid = proc.pid
		}
		t.Errorf("after Destruct, a worker whose start failed scheduled %d restart(s), is in state %d (closed is %d), and runs process %d (rt.procs %d)",
			scheduled, st, stateClosed, pid, rt.procs.Load())
	}
	w.stop("test cleanup")
}

// Attack (held): the process count drifting (rt.procs, which replaceLocked
// compares with max_processes): starts that fail (the program cannot be
// executed) and their back-off restarts, a program killed and restarted,
// a credential change with nothing in progress (the old process stops at
// once), and a reload (Destruct) while a user's program is starting.
// Expected: rt.procs is the number of processes alive or starting — 0
// when none is — so max_processes neither refuses forever nor lets too
// many run. Holds.
func TestWindingProcessCountDoesNotDrift(t *testing.T) {
	ft := useFakeTimers(t)
	settles := func(what string, want int64, rt *runtime) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && rt.procs.Load() != want; {
			time.Sleep(20 * time.Millisecond)
		}
		if n := rt.procs.Load(); n != want {
			t.Errorf("%s: rt.procs is %d, want %d", what, n, want)
		}
	}
	initialize := func(r *bridgetest.Runner) {
		resp := r.Send(http.MethodPost, `{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"runner","version":"1"}}}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	broken := testSpec(t, stdioserver.ModeServe)
	broken.Command = []string{"/nonexistent/toolgate-test-program"}
	rtb := startBounded(t, broken)
	initialize(&bridgetest.Runner{T: t, RT: rtb.bridge, User: "alice"})
	scheduled := func() bool {
		ft.mu.Lock()
		defer ft.mu.Unlock()
		return len(ft.pending) > 0
	}
	for range 3 {
		waitFor(t, "a restart is scheduled", scheduled)
		ft.fire(t)
	}
	waitFor(t, "a restart is scheduled", scheduled)
	settles("after four failed starts", 0, rtb)

	s := testSpec(t, stdioserver.ModeServe)
	s.PerUser, s.CredEnv, s.CredHeader, s.MaxProcs = true, "TOKEN", "Authorization", 2
	rt := newRuntime(s, zap.NewNop()) // this test destructs it, once
	var once sync.Once
	destruct := func() { once.Do(func() { _ = rt.Destruct() }) }
	t.Cleanup(destruct)
	alice := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice", Header: http.Header{"Authorization": {"Bearer alice-token-1"}}}
	alice.Initialize(bridgetest.NoCapabilities)
	_ = syscall.Kill(who(t, alice).PID, syscall.SIGKILL)
	waitFor(t, "alice's program waits to restart", func() bool { return rt.workerState("alice") == stateBackoff })
	settles("after a crash", 0, rt)
	waitFor(t, "a restart is scheduled", scheduled)
	ft.fire(t)
	waitFor(t, "alice's program runs again", func() bool { return rt.workerState("alice") == stateRunning })
	settles("after a restart", 1, rt)
	alice.Header.Set("Authorization", "Bearer alice-token-2")
	alice.Initialize(bridgetest.NoCapabilities)
	settles("after a credential change with nothing in progress", 1, rt)

	bob := &bridgetest.Runner{T: t, RT: rt.bridge, User: "bob", Header: http.Header{"Authorization": {"Bearer bob-token-1"}}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		initialize(bob)
	}()
	waitFor(t, "bob's program is starting", func() bool { return rt.workerState("bob") == stateStarting })
	destruct()
	<-done
	settles("after Destruct during a start", 0, rt)
}
