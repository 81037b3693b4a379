package stdio

// Review of 68e6dee's program fixes: the back-off restart with a new
// credential, max_processes counting retiring processes (placesLocked),
// and what its lock order meets.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/toolgate/toolgate/internal/mcpbridge/bridgetest"
)

// envFixReview puts this test binary in a program mode of this file's
// (checked in init, before TestMain).
const envFixReview = "TOOLGATE_FIXREVIEW_PROGRAM"

func init() {
	if mode := os.Getenv(envFixReview); mode != "" {
		fixReviewProgram(mode)
		os.Exit(0)
	}
}

// startBounded is start (stdio_test.go) whose cleanup gives Destruct 15 s
// and reports it hanging, rather than hanging the test binary.
func startBounded(t *testing.T, s *spec) *runtime {
	t.Helper()
	rt := newRuntime(s, zap.NewNop())
	t.Cleanup(func() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = rt.Destruct()
		}()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Errorf("runtime.Destruct (a reload, a shutdown) did not return within 15 s")
		}
	})
	return rt
}

// fixReviewProgram is an MCP server on stdin/stdout. request-flood: each
// tools/call first sends 1000 sampling/createMessage requests (valid
// JSON-RPC, the client declared no sampling), then answers. slow-sample:
// a tools/call asks the client to sample and is answered with the result.
// slow-answer: a tools/call is answered after a second. mute: a
// tools/call makes it close its stdout — it can answer nothing more —
// while it goes on running, reading its stdin until that closes.
func fixReviewProgram(mode string) {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	n := 0
	callID := ""
	for in.Scan() {
		line := in.Bytes()
		id := gjson.GetBytes(line, "id").Raw
		if mode == "slow-sample" && id == `"srv-sample"` && callID != "" {
			// The runner's answer to the sampling request: the call ends.
			fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"sampled: %s"}]}}`+"\n",
				callID, gjson.GetBytes(line, "result.content.text").String())
			callID = ""
			continue
		}
		switch gjson.GetBytes(line, "method").String() {
		case "initialize":
			fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"flood","version":"1"}}}`+"\n", id)
		case "tools/call":
			if mode == "mute" {
				os.Stdout.Close()
				_, _ = io.Copy(io.Discard, os.Stdin)
				return
			}
			if mode == "slow-answer" {
				// Works a second, then answers (a single write: atomic on
				// a pipe).
				go func(id string) {
					time.Sleep(time.Second)
					fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"done"}]}}`+"\n", id)
				}(id)
				continue
			}
			if mode == "slow-sample" {
				// Asks its client to sample, and answers the call with
				// what it got.
				callID = id
				fmt.Println(`{"jsonrpc":"2.0","id":"srv-sample","method":"sampling/createMessage","params":{"messages":[{"role":"user","content":{"type":"text","text":"hi"}}],"maxTokens":5}}`)
				continue
			}
			w := bufio.NewWriter(os.Stdout)
			for range 1000 {
				n++
				fmt.Fprintf(w, `{"jsonrpc":"2.0","id":"srv-%d","method":"sampling/createMessage","params":{"messages":[],"maxTokens":1}}`+"\n", n)
			}
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"done"}]}}`+"\n", id)
			w.Flush()
		}
	}
}

// Attack (fixed): a per_user program with credential_env checks its token as it
// starts and exits on a bad one (token-gate). A user stores one bad token
// after another (PUT /v1/connections/svc, or a connect whose token the
// program refuses) and initializes after each. Expected: the restart
// back-off (250 ms doubling to 8 s, README) bounds how often toolgate
// starts the program for them: in about 2 s at most ~5 starts. Happens:
// worker.ready (supervisor.go:370-382) starts at once, and resets
// w.failures to 0, whenever the request's credential differs from the
// one the worker waits to restart with — so a user who rotates tokens
// makes toolgate fork/exec the program (and the program call its
// provider with each token) once per request, the back-off never growing.
// Fix: keep w.failures (do not reset it) and start at once only the first
// time a credential replaces the failing one; later changes wait for
// retryAt like the rest.
func TestFixReviewRotatedBadTokensBypassBackoff(t *testing.T) {
	s := hostileSpec(t, "token-gate")
	s.PerUser, s.CredEnv, s.CredHeader = true, "TOKEN", "Authorization"
	rt := start(t, s, zap.NewNop())
	deadline := time.Now().Add(2 * time.Second)
	sent := 0
	for i := 0; i < 40 && time.Now().Before(deadline); i++ {
		r := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice", Header: http.Header{"Authorization": {fmt.Sprintf("Bearer bad-token-%d", i)}}}
		resp := r.Send(http.MethodPost, `{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"runner","version":"1"}}}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		sent++
	}
	time.Sleep(100 * time.Millisecond)
	ends := rt.schedule()
	if len(ends) > 6 {
		t.Errorf("%d initializes with rotated bad tokens in ~2 s made the program start and end %d times (back-off allows ~5); delays: %v",
			sent, len(ends), ends[:min(len(ends), 8)])
	}
}

// Attack (fixed): per_user, max_processes 2. alice has a long call in progress on
// her process P1; her token changes (another runner of hers uses the new
// one), so P1 retires, finishing the call, beside her new process P2 —
// two places. bob connects. Expected (README: over max_processes toolgate
// "stops its least recently used idle process", and a credential change
// lets "calls in progress finish"): P2, idle, may go for bob, or bob gets
// a retryable error; alice's call in progress on P1 goes on. Happens:
// runtime.worker (supervisor.go:158-170) picks alice's worker as idle —
// worker.busy (supervisor.go:427-445) looks only at w.link (P2), not at
// the processes in w.retiring — and worker.stop (supervisor.go:570-583)
// kills every retiring process with it: P1 dies and alice's call is lost.
// Fix: worker.busy counts the retiring processes' links (Link.Busy), or
// eviction stops only w.proc and leaves retiring processes to finish
// (placesLocked then still counts them).
func TestFixReviewEvictionKillsRetiringCall(t *testing.T) {
	s := testSpec(t, "serve")
	s.PerUser, s.CredEnv, s.CredHeader, s.MaxProcs = true, "TOKEN", "Authorization", 2
	rt := start(t, s, nil)
	alice := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice", Header: http.Header{"Authorization": {"Bearer alice-token-1"}}}
	alice.Initialize(bridgetest.NoCapabilities)
	oldPID := who(t, alice).PID
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	callDone := make(chan string, 1)
	go func() {
		resp := alice.SendCtx(ctx, http.MethodPost, `{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"wait","arguments":{}}}`)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		callDone <- string(b)
	}()
	waitFor(t, "alice's call is in progress", func() bool { busy, _ := rt.workers["alice"].busy(); return busy })
	alice2 := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice", Header: http.Header{"Authorization": {"Bearer alice-token-2"}}}
	alice2.Initialize(bridgetest.NoCapabilities)
	if pid := who(t, alice2).PID; pid == oldPID {
		t.Fatal("control: alice was not moved to a new process")
	}
	if syscall.Kill(oldPID, 0) != nil {
		t.Fatal("control: alice's old process stopped at once; the scenario needs it retiring")
	}
	bob := &bridgetest.Runner{T: t, RT: rt.bridge, User: "bob", Header: http.Header{"Authorization": {"Bearer bob-token-1"}}}
	resp := bob.Send(http.MethodPost, `{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"runner","version":"1"}}}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	select {
	case b := <-callDone:
		t.Errorf("alice's call in progress on her retiring process ended when bob connected: %q (process %d alive: %v)",
			b, oldPID, syscall.Kill(oldPID, 0) == nil)
	case <-time.After(2 * time.Second):
		if syscall.Kill(oldPID, 0) != nil {
			t.Errorf("alice's retiring process %d was stopped with her call in progress", oldPID)
		}
	}
	cancel()
}

// Attack (fixed): the lock order placesLocked adds. runtime.worker holds rt.mu
// and, in placesLocked (supervisor.go:185-193, called at 158), takes each worker's w.mu
// — on every first request of a user, not only at max_processes; a
// process that ends runs worker.ended, which holds w.mu (supervisor.go:
// 520-521, deferred unlock) while recordRestart (supervisor.go:549, 288) takes
// rt.mu. A new user's first request racing any program's exit: each
// goroutine holds the lock the other waits for, and rt.mu is then held
// for good (every request of the service, the idle sweep, Destruct on
// reload hang). The test plays runtime.worker's part (rt.mu held, then
// placesLocked) against the real worker.ended. Expected: placesLocked
// returns. Happens: it waits for w.mu forever. (sweep and holding had the
// same rt.mu→w.mu order before; placesLocked puts it on the common path.)
// Fix: in ended, call recordRestart after w.mu is released (or give
// restarts its own mutex).
func TestFixReviewPlacesLockedDeadlocksWithEnded(t *testing.T) {
	prev := afterFunc
	afterFunc = func(time.Duration, func()) interface{ Stop() bool } { return time.AfterFunc(time.Hour, func() {}) }
	t.Cleanup(func() { afterFunc = prev })
	rt := newRuntime(testSpec(t, "serve"), zap.NewNop())
	started := make(chan struct{})
	w := &worker{rt: rt, key: "alice", retiring: map[*process]struct{}{}, state: stateStarting, started: started}
	rt.workers["alice"] = w

	rt.mu.Lock() // runtime.worker("bob"), about to call placesLocked
	endedDone := make(chan struct{})
	go func() { // alice's process did not start (or ended)
		defer close(endedDone)
		w.ended(nil, started, "exited with status 1", "exit")
	}()
	// Until ended holds w.mu and waits for rt.mu (a version that lets go
	// of w.mu first is never seen holding it: then go on after a while).
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline) && w.mu.TryLock(); {
		w.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	placesDone := make(chan struct{})
	go func() {
		defer close(placesDone)
		_, _ = w.busy() // what runtime.worker does under rt.mu (now only to evict at max_processes)
	}()
	select {
	case <-placesDone:
	case <-time.After(2 * time.Second):
		t.Errorf("deadlock: placesLocked (under rt.mu) waits for w.mu, which worker.ended holds while it waits for rt.mu")
	}
	rt.mu.Unlock() // the test, unlike runtime.worker, can let go
	for _, ch := range []chan struct{}{endedDone, placesDone} {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatal("still blocked after rt.mu was released")
		}
	}
}

// Attack (fixed): none needed — the path 68e6dee made the rule. A per_user
// program with credential_env; alice's call is in progress (the program
// answers it a second later) when her token changes and her runner
// initializes with the new one: her old process retires, to stop "once
// its requests are answered". The program answers the call. Expected: the
// answer reaches her, then the old process stops and is counted no more
// (rt.procs back to 1), and Destruct (a reload, a shutdown) returns.
// Happens: the answer is read by the process's stdout reader, which runs
// Link.response → deliver (internal/mcpbridge/link.go:515-518), whose
// deferred idle() is retireLocked's func (supervisor.go:464,
// p.stop) — on the reader goroutine itself. p.stop (process.go:443-466)
// waits for p.done; serve closes p.done only after drain
// (process.go:152, 174-190), which waits for the readers — this one
// included. The process is SIGTERMed and reaped, but serve never ends:
// ended never runs, rt.procs and w.retiring keep it forever (one place of
// max_processes lost per credential change), the link is never closed,
// and worker.stop/Destruct wait for it forever (Caddy's reload or
// shutdown hangs). Before 68e6dee the session ended on the credential
// change, cancelling its calls, so the last request rarely ended on the
// reader. Fix: run the onIdle callback on its own goroutine (go idle() in
// Link.deliver/dropLocked, or `go p.stop(...)` inside retireLocked's func).
func TestFixReviewRetiringProcessStopDeadlocks(t *testing.T) {
	s := testSpec(t, "")
	s.Env = append(s.Env, envFixReview+"=slow-answer")
	s.StartTimeout = 5 * time.Second
	s.PerUser, s.CredEnv, s.CredHeader = true, "TOKEN", "Authorization"
	rt := startBounded(t, s)
	alice := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice", Header: http.Header{"Authorization": {"Bearer alice-token-1"}}}
	alice.Initialize(bridgetest.NoCapabilities)
	answer := make(chan string, 1)
	go func() {
		resp := alice.Send(http.MethodPost, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","arguments":{}}}`)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answer <- string(b)
	}()
	waitFor(t, "alice's call is in progress", func() bool { busy, _ := rt.workers["alice"].busy(); return busy })
	alice2 := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice", Header: http.Header{"Authorization": {"Bearer alice-token-2"}}}
	alice2.Initialize(bridgetest.NoCapabilities)
	select {
	case b := <-answer:
		if !strings.Contains(b, "done") {
			t.Fatalf("the call in progress on the retiring process: %q", b)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call in progress on the retiring process got no answer")
	}
	deadline := time.Now().Add(8 * time.Second) // the stop's grace is 5 s
	for time.Now().Before(deadline) && rt.procs.Load() > 1 {
		time.Sleep(50 * time.Millisecond)
	}
	if n := rt.procs.Load(); n > 1 {
		t.Errorf("8 s after its last call was answered, the retiring process still counts: %d processes for one user", n)
	}
}

// Attack (fixed): the log budget for what a program writes (README "Bounded
// output": at most 200 lines per 10 s; 68e6dee put malformed lines under
// it) against valid messages toolgate refuses: a program answers each
// tools/call after sending 1000 sampling/createMessage requests the
// caller's runner did not declare. Expected: what one program makes
// toolgate log is bounded like its junk (at most stderrBudget entries per
// stderrWindow, the rest counted). Happens: Link.serverRequest
// (internal/mcpbridge/link.go:561-562) logs an Info "refused a server
// request" for each, outside any budget: 1000 log entries per call,
// without bound. Fix: give LinkConfig a budget hook for refusals as for
// LogMalformed (p.stdoutLog.take), or log refusals once per window with
// a count. Fixed: LinkConfig.MayLog bounds refusals too, with the
// program's stdout budget.
func TestFixReviewRefusedServerRequestsEscapeLogBudget(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	s := testSpec(t, "")
	s.Env = append(s.Env, envFixReview+"=request-flood")
	s.StartTimeout = 5 * time.Second
	rt := start(t, s, zap.New(core))
	r := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice"}
	r.Initialize(bridgetest.NoCapabilities)
	if got := bridgetest.ToolText(callTool(r, 1, "x", "{}")); got != "done" {
		t.Fatalf("call: %q", got)
	}
	time.Sleep(200 * time.Millisecond)
	if n := logs.FilterMessage("refused a server request").Len(); n > stderrBudget {
		t.Errorf("one call made toolgate log %d refused server requests (budget: %d per %v)", n, stderrBudget, stderrWindow)
	}
}

// Attack (fixed): per_user, max_processes 3. alice and bob each have a long call
// in progress (2 processes); both their tokens change at once (both store
// new ones, or toolgate refreshes both) and their runners initialize with
// the new ones. Expected (README: max_processes counts the processes a
// credential change retires; a user who stores new credentials "does not
// get a process for each"): at most 3 processes — one of the old ones is
// stopped at once, or one start waits. Happens: retireLocked
// (supervisor.go:456-465) checks rt.procs, which run counts only after
// the fork (supervisor.go:476), under the worker's own w.mu: two workers'
// changes both read 2 < 3 and both keep their old process retiring beside
// a new one — 4 processes. Fix: reserve the place when the start is
// decided: count a starting process in rt.procs in startLocked (or
// check and reserve under rt.mu). Fixed: startLocked takes the place as
// the start is decided, and replaceLocked stops the old process at once
// when the count with the new one's place is over max_processes.
func TestFixReviewConcurrentCredentialChangesExceedMaxProcesses(t *testing.T) {
	s := testSpec(t, "serve")
	s.PerUser, s.CredEnv, s.CredHeader, s.MaxProcs = true, "TOKEN", "Authorization", 3
	rt := startBounded(t, s) // see TestFixReviewRetiringProcessStopDeadlocks
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := make(chan struct{}, 2)
	for _, user := range []string{"alice", "bob"} {
		r := &bridgetest.Runner{T: t, RT: rt.bridge, User: user, Header: http.Header{"Authorization": {"Bearer " + user + "-token-1"}}}
		r.Initialize(bridgetest.NoCapabilities)
		go func() {
			defer func() { calls <- struct{}{} }()
			resp := r.SendCtx(ctx, http.MethodPost, `{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"wait","arguments":{}}}`)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
		waitFor(t, user+"'s call is in progress", func() bool { busy, _ := rt.workers[user].busy(); return busy })
	}
	go1 := make(chan struct{})
	done := make(chan struct{}, 2)
	for _, user := range []string{"alice", "bob"} {
		r := &bridgetest.Runner{T: t, RT: rt.bridge, User: user, Header: http.Header{"Authorization": {"Bearer " + user + "-token-2"}}}
		go func() {
			defer func() { done <- struct{}{} }()
			<-go1
			resp := r.SendCtx(ctx, http.MethodPost, `{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"runner","version":"1"}}}`)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	close(go1)
	<-done
	<-done
	if n := rt.procs.Load(); n > int64(s.MaxProcs) {
		t.Errorf("%d processes alive on a service with max_processes %d (%d retiring)", n, s.MaxProcs, len(rt.startedPIDs())-2)
	}
	cancel()
	<-calls
	<-calls
}

// Attack (fixed): none needed — routine use. A per_user program with
// credential_env; alice's tool call asks her runner to sample
// (sampling/createMessage on the call's stream) and waits for the answer;
// meanwhile toolgate refreshes her token, so her runner's answer to the
// sampling request carries the new credential. Expected (README, and the
// fix 68e6dee: "a credential change lets calls in progress finish"): the
// answer reaches the program and the call finishes. Happens:
// Bridge.RoundTrip (internal/mcpbridge/bridge.go:229-235) sees another
// credential on the answer, forgets the session and retires it
// (session.go:38-56), and answers the runner's message as gone: the
// answer to the program's request is dropped, and the call the retire was
// meant to let finish waits for it until it times out (the old process
// with it). Fix: route a runner's answer to a server request of a
// retiring session (the link's serverRequests) before the OnRequest
// check, or keep a retiring session reachable for answers to its own
// server requests. Fixed: a session whose runner's credential changed
// winds down — it takes the answers and cancellations its calls wait for,
// and refuses the rest as gone.
func TestFixReviewCredentialChangeLosesAnswerToCallsServerRequest(t *testing.T) {
	s := testSpec(t, "")
	s.Env = append(s.Env, envFixReview+"=slow-sample")
	s.StartTimeout = 5 * time.Second
	s.PerUser, s.CredEnv, s.CredHeader = true, "TOKEN", "Authorization"
	rt := start(t, s, nil)
	alice := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice", Header: http.Header{"Authorization": {"Bearer alice-token-1"}}}
	alice.Initialize(bridgetest.Sampling)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp := alice.SendCtx(ctx, http.MethodPost, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"x","arguments":{}}}`)
	defer resp.Body.Close()
	events := bridgetest.Events(resp.Body)
	ask := bridgetest.Next(t, events)
	if gjson.Get(ask, "method").String() != "sampling/createMessage" {
		t.Fatalf("the call's first message: %s", ask)
	}
	alice.Header.Set("Authorization", "Bearer alice-token-2") // refreshed meanwhile
	answer := alice.Send(http.MethodPost, `{"jsonrpc":"2.0","id":`+gjson.Get(ask, "id").Raw+
		`,"result":{"role":"assistant","content":{"type":"text","text":"ok"},"model":"m"}}`)
	_, _ = io.Copy(io.Discard, answer.Body)
	answer.Body.Close()
	select {
	case msg, ok := <-events:
		if !ok || !strings.Contains(msg, "sampled: ok") {
			t.Errorf("the call in progress ended without its answer: %q (open: %v)", msg, ok)
		}
	case <-time.After(3 * time.Second):
		t.Errorf("the runner's answer to the call's sampling request was dropped (HTTP %d): the call waits for it until it times out", answer.StatusCode)
	}
	cancel()
}
