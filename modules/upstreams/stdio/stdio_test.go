package stdio

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/toolgate/toolgate/internal/mcpbridge/bridgetest"
	"github.com/toolgate/toolgate/internal/stdioserver"
	"github.com/toolgate/toolgate/modules/gateway"
)

const testSecret = "supersecret-value-42"

// testSpec runs this test binary as an MCP server in mode.
func testSpec(t *testing.T, mode string) *spec {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return &spec{Service: "svc", Command: []string{exe, "-test.run=^$"},
		Env:  []string{"PATH=" + defaultPath, "TEST_SECRET=" + testSecret, stdioserver.EnvMode + "=" + mode},
		Path: defaultPath, Dir: "/", Idle: time.Minute, Stop: 5 * time.Second, MaxProcs: 10,
		StartTimeout: 30 * time.Second, MaxMessage: 1 << 20, Depth: 64, secrets: []string{testSecret}}
}

// start runs the spec's runtime until the test ends, then checks that
// every process it started is gone.
func start(t *testing.T, s *spec, logger *zap.Logger) *runtime {
	t.Helper()
	if logger == nil {
		logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	}
	rt := newRuntime(s, logger)
	t.Cleanup(func() {
		pids := rt.startedPIDs()
		_ = rt.Destruct()
		for _, pid := range pids {
			assertGone(t, pid)
		}
	})
	return rt
}

// startedPIDs lists the processes the runtime's workers hold.
func (rt *runtime) startedPIDs() []int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var pids []int
	for _, w := range rt.workers {
		w.mu.Lock()
		if w.proc != nil {
			pids = append(pids, w.proc.pid)
		}
		for p := range w.retiring {
			pids = append(pids, p.pid)
		}
		w.mu.Unlock()
	}
	return pids
}

// assertGone checks that no process pid exists, and none in its group.
func assertGone(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("process %d still exists (kill 0: %v)", pid, err)
	}
	if members := groupMembers(pid); len(members) > 0 {
		t.Errorf("process group %d still has processes %v", pid, members)
	}
}

// groupMembers lists the processes whose process group is pgid.
func groupMembers(pgid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp …; comm may hold spaces.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 2 && fields[2] == strconv.Itoa(pgid) {
			out = append(out, pid)
		}
	}
	return out
}

func runnerOf(t *testing.T, rt *runtime, user string) *bridgetest.Runner {
	t.Helper()
	r := &bridgetest.Runner{T: t, RT: rt.bridge, User: user}
	if res := r.Initialize(bridgetest.Sampling); gjson.Get(res, "result.serverInfo.name").String() != "stdio-test-server" {
		t.Fatalf("initialize: %s", res)
	}
	return r
}

func callTool(r *bridgetest.Runner, id int, name, args string) string {
	r.T.Helper()
	msgs := r.Call(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, id, name, args))
	if len(msgs) == 0 {
		r.T.Fatalf("%s: no answer", name)
	}
	return msgs[len(msgs)-1]
}

type whoami struct {
	PID, PGID, UID int
	Dir            string
}

func who(t *testing.T, r *bridgetest.Runner) whoami {
	t.Helper()
	var w whoami
	if err := json.Unmarshal([]byte(bridgetest.ToolText(callTool(r, 900, "whoami", "{}"))), &w); err != nil || w.PID == 0 {
		t.Fatalf("whoami: %v", err)
	}
	return w
}

func envOf(t *testing.T, r *bridgetest.Runner) []string {
	t.Helper()
	var env []string
	if err := json.Unmarshal([]byte(bridgetest.ToolText(callTool(r, 901, "env", "{}"))), &env); err != nil {
		t.Fatalf("env: %v", err)
	}
	return env
}

// fakeTimers replaces the restart timers: restarts are recorded, and run
// when the test fires them.
type fakeTimers struct {
	mu      sync.Mutex
	pending []func()
}

func useFakeTimers(t *testing.T) *fakeTimers {
	ft := &fakeTimers{}
	old := afterFunc
	afterFunc = func(_ time.Duration, f func()) interface{ Stop() bool } {
		ft.mu.Lock()
		ft.pending = append(ft.pending, f)
		ft.mu.Unlock()
		return stopper{}
	}
	t.Cleanup(func() { afterFunc = old })
	return ft
}

type stopper struct{}

func (stopper) Stop() bool { return true }

// fire runs the restart scheduled last.
func (ft *fakeTimers) fire(t *testing.T) {
	t.Helper()
	ft.mu.Lock()
	defer ft.mu.Unlock()
	if len(ft.pending) == 0 {
		t.Fatal("no restart is scheduled")
	}
	f := ft.pending[len(ft.pending)-1]
	ft.pending = ft.pending[:len(ft.pending)-1]
	go f()
}

// fakeClock replaces the clock: it stands still unless advanced.
func fakeClock(t *testing.T) func(time.Duration) {
	var offset atomic.Int64
	old := now
	now = func() time.Time { return old().Add(time.Duration(offset.Load())) }
	t.Cleanup(func() { now = old })
	return func(d time.Duration) { offset.Add(int64(d)) }
}

func fixedRandom(t *testing.T, v float64) {
	old := random
	random = func() float64 { return v }
	t.Cleanup(func() { random = old })
}

// waitFor polls cond, at most 20s; the bound only keeps a broken test
// from hanging.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 2000 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("never: %s", what)
}

func (rt *runtime) workerState(key string) state {
	rt.mu.Lock()
	w := rt.workers[key]
	rt.mu.Unlock()
	if w == nil {
		return stateClosed
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state
}

func (rt *runtime) schedule() []restart {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return slices.Clone(rt.restarts)
}

// The program gets only the environment its service lists, runs in a
// process group of its own, in the working directory given.
func TestProgramIsIsolated(t *testing.T) {
	s := testSpec(t, stdioserver.ModeServe)
	s.Dir = t.TempDir()
	t.Setenv("TOOLGATE_TEST_PARENT_ONLY", "must not be inherited")
	rt := start(t, s, nil)
	r := runnerOf(t, rt, "alice")
	want := []string{"PATH=" + defaultPath, "TEST_SECRET=" + testSecret, stdioserver.EnvMode + "=" + stdioserver.ModeServe}
	if env := envOf(t, r); !slices.Equal(env, want) {
		t.Errorf("the program's environment is %q, want exactly %q", env, want)
	}
	w := who(t, r)
	if w.PGID != w.PID || w.PGID == syscall.Getpgrp() {
		t.Errorf("the program (pid %d) is in process group %d; want its own (toolgate's is %d)", w.PID, w.PGID, syscall.Getpgrp())
	}
	if w.Dir != s.Dir {
		t.Errorf("working directory %q, want %q", w.Dir, s.Dir)
	}
}

// No file descriptor of toolgate's reaches the program: it has its three
// pipes and what it opened itself.
func TestProgramGetsNoDescriptorsOfToolgate(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, err := os.Create(filepath.Join(t.TempDir(), "open-file"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A descriptor without close-on-exec, like one toolgate inherited from
	// whatever started it (syscall.Pipe does not set it).
	var inherited [2]int
	if err := syscall.Pipe(inherited[:]); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(inherited[0])
	defer syscall.Close(inherited[1])
	rt := start(t, testSpec(t, stdioserver.ModeServe), nil)
	pid := who(t, runnerOf(t, rt, "alice")).PID
	ours := fdTargets(t, os.Getpid(), nil)
	if ours[f.Name()] == "" || len(ours) < 3 {
		t.Fatalf("the test's own descriptors are not seen: %v", ours)
	}
	for fd, target := range fdTargets(t, pid, map[string]bool{"0": true, "1": true, "2": true}) {
		// Pipes and sockets are told apart by inode; of files, only the
		// one this test opened is surely not the program's own opening.
		unique := strings.HasPrefix(target, "pipe:") || strings.HasPrefix(target, "socket:") || target == f.Name()
		if unique && ours[target] != "" {
			t.Errorf("the program's descriptor %s is toolgate's %s (%s)", fd, ours[target], target)
		}
	}
}

// fdTargets maps the targets of a process's descriptors that name one
// object (a socket, a pipe, a file; not an anonymous inode, whose name all
// share) to their numbers (for ours, skip nil) or the other way round;
// skip lists descriptors to leave out.
func fdTargets(t *testing.T, pid int, skip map[string]bool) map[string]string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || skip[e.Name()] || strings.HasPrefix(target, "anon_inode:") || target == "/dev/null" {
			continue
		}
		if skip == nil {
			out[target] = e.Name()
		} else {
			out[e.Name()] = target
		}
	}
	return out
}

// A program killed during a call: that call gets a retryable error and is
// not sent again; calls while it waits to restart are told so; after the
// restart, sessions are made anew. Repeated ends back off, and a stable run
// resets the backoff — read from the recorded schedule.
func TestCrashRestartsWithBackoff(t *testing.T) {
	timers := useFakeTimers(t)
	advance := fakeClock(t)
	fixedRandom(t, 1) // the shortest delay of each step: 4/5 of it
	rt := start(t, testSpec(t, stdioserver.ModeServe), nil)
	alice := runnerOf(t, rt, "alice")
	first := who(t, alice).PID

	resp := alice.Send(http.MethodPost, `{"jsonrpc":"2.0","id":"w","method":"tools/call","params":{"name":"wait","arguments":{}}}`)
	defer resp.Body.Close()
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	msgs := bridgetest.Messages(resp, data)
	if len(msgs) != 1 || gjson.Get(msgs[0], "id").String() != "w" || gjson.Get(msgs[0], "error.code").Int() != gateway.CodeUnavailable ||
		!gjson.Get(msgs[0], "error.data.retryable").Bool() ||
		gjson.Get(msgs[0], "error.message").String() != "the program of service svc was killed by SIGKILL while the request was in progress; toolgate does not send it again, so it may or may not have run" {
		t.Fatalf("the call in progress when the program died: %q", msgs)
	}
	waitFor(t, "a restart is scheduled", func() bool { return len(rt.schedule()) == 1 })

	// Down, waiting to restart: requests are told why.
	msgs = alice.Call(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if len(msgs) != 1 || !gjson.Get(msgs[0], "error.data.retryable").Bool() ||
		!strings.HasPrefix(gjson.Get(msgs[0], "error.message").String(), "the program of service svc was killed by SIGKILL; toolgate restarts it in ") {
		t.Fatalf("a request while the program is down: %q", msgs)
	}
	timers.fire(t)
	waitFor(t, "the program runs again", func() bool { return rt.workerState("") == stateRunning })
	if r := alice.Send(http.MethodPost, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`); r.StatusCode != http.StatusNotFound {
		t.Fatalf("the old session after the restart: %d, want 404 so that the proxy initializes again", r.StatusCode)
	}
	alice = runnerOf(t, rt, "alice")
	second := who(t, alice).PID
	if second == first {
		t.Fatal("the same process after a restart")
	}

	// It ends again at once: a longer delay.
	if msg := callTool(alice, 4, "crash", "{}"); !strings.Contains(gjson.Get(msg, "error.message").String(), "exited with status 3") {
		t.Fatalf("crash: %s", msg)
	}
	waitFor(t, "a second restart is scheduled", func() bool { return len(rt.schedule()) == 2 })
	timers.fire(t)
	waitFor(t, "the program runs again", func() bool { return rt.workerState("") == stateRunning })

	// A run longer than the stable period resets the backoff.
	alice = runnerOf(t, rt, "alice")
	advance(stablePeriod)
	callTool(alice, 5, "crash", "{}")
	waitFor(t, "a third restart is scheduled", func() bool { return len(rt.schedule()) == 3 })
	want := []restart{{200 * time.Millisecond, "exited"}, {400 * time.Millisecond, "exited"}, {200 * time.Millisecond, "exited"}}
	if got := rt.schedule(); !slices.Equal(got, want) {
		t.Fatalf("restart schedule %v, want %v", got, want)
	}
}

// A program that exits at once, every time, is restarted with doubling
// delays up to 8s, jittered below the nominal delay.
func TestBackoffSchedule(t *testing.T) {
	timers := useFakeTimers(t)
	fixedRandom(t, 1)
	restarts := stdioMetrics.restarts.WithLabelValues("svc", "exited")
	before := testutil.ToFloat64(restarts)
	rt := start(t, testSpec(t, stdioserver.ModeExit), nil)
	r := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice"}
	res := r.Initialize(bridgetest.NoCapabilities)
	if r.Session != "" || !gjson.Get(res, "error.data.retryable").Bool() ||
		!strings.HasPrefix(gjson.Get(res, "error.message").String(), "the program of service svc exited with status 1; toolgate restarts it in ") {
		t.Fatalf("initialize with a program that exits: %s", res)
	}
	for n := 2; n <= 8; n++ {
		timers.fire(t)
		waitFor(t, fmt.Sprintf("restart %d is scheduled", n), func() bool { return len(rt.schedule()) == n })
	}
	var got []time.Duration
	for _, r := range rt.schedule() {
		if r.Reason != "exited" {
			t.Errorf("reason %q, want exited", r.Reason)
		}
		got = append(got, r.Delay)
	}
	ms := time.Millisecond
	want := []time.Duration{200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 6400 * ms, 6400 * ms, 6400 * ms}
	if !slices.Equal(got, want) {
		t.Fatalf("delays %v, want %v", got, want)
	}
	if n := testutil.ToFloat64(restarts) - before; n != 8 {
		t.Errorf("toolgate_stdio_restarts_total grew by %v, want 8", n)
	}
	// The jitter stays within the fifth below the nominal delay.
	for n := 1; n <= 8; n++ {
		nominal := min(minBackoff<<(n-1), maxBackoff)
		for _, v := range []float64{0, 0.5, 0.999} {
			if d := backoff(n, func() float64 { return v }); d > nominal || d < nominal*4/5 {
				t.Errorf("backoff(%d) with %v = %s, outside (%s, %s]", n, v, d, nominal*4/5, nominal)
			}
		}
	}
}

// A program that writes a line longer than the message bound is ended and
// restarted; the call in progress is told why.
func TestEndlessLineIsRefused(t *testing.T) {
	useFakeTimers(t)
	rt := start(t, testSpec(t, stdioserver.ModeServe), nil)
	alice := runnerOf(t, rt, "alice")
	msg := callTool(alice, 1, "flood", "{}")
	if !gjson.Get(msg, "error.data.retryable").Bool() || !strings.Contains(gjson.Get(msg, "error.message").String(),
		"the program of service svc wrote a line longer than max_response_size (1.0 MiB) to its stdout while the request was in progress") {
		t.Fatalf("flood: %s", msg)
	}
	waitFor(t, "a restart is scheduled", func() bool { return len(rt.schedule()) == 1 })
	if got := rt.schedule()[0].Reason; got != "line_too_long" {
		t.Fatalf("restart reason %q", got)
	}
}

// Stopping sends SIGTERM to the group; a program that ignores it is killed
// after the grace period. One that heeds it is not.
func TestStopKillsAfterGracePeriod(t *testing.T) {
	for _, tc := range []struct {
		mode       string
		wantKilled bool
	}{{stdioserver.ModeIgnoreTerm, true}, {stdioserver.ModeServe, false}} {
		t.Run(tc.mode, func(t *testing.T) {
			s := testSpec(t, tc.mode)
			s.Stop = 300 * time.Millisecond
			processes := stdioMetrics.processes.WithLabelValues("svc")
			before := testutil.ToFloat64(processes)
			rt := newRuntime(s, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)))
			pid := who(t, runnerOf(t, rt, "alice")).PID
			if n := testutil.ToFloat64(processes) - before; n != 1 {
				t.Errorf("toolgate_stdio_processes rose by %v with one program running, want 1", n)
			}
			rt.mu.Lock()
			w := rt.workers[""]
			rt.mu.Unlock()
			w.mu.Lock()
			p := w.proc
			w.mu.Unlock()
			if err := rt.Destruct(); err != nil {
				t.Fatal(err)
			}
			p.mu.Lock()
			killed := p.sigkilled
			p.mu.Unlock()
			if killed != tc.wantKilled {
				t.Errorf("needed SIGKILL: %v, want %v", killed, tc.wantKilled)
			}
			assertGone(t, pid)
			if n := testutil.ToFloat64(processes) - before; n != 0 {
				t.Errorf("toolgate_stdio_processes is %v above where it was once the program stopped", n)
			}
		})
	}
}

// perUserPair runs a per_user program that gets each user's token in
// TOKEN, and initializes a session of alice's (alice-token-1) and of bob's
// (bob-token-1) on it.
func perUserPair(t *testing.T) (rt *runtime, alice, bob *bridgetest.Runner) {
	s := testSpec(t, stdioserver.ModeServe)
	s.PerUser, s.CredEnv, s.CredHeader = true, "TOKEN", "Authorization"
	rt = start(t, s, nil)
	runner := func(user, token string) *bridgetest.Runner {
		r := &bridgetest.Runner{T: t, RT: rt.bridge, User: user, Header: http.Header{"Authorization": {"Bearer " + token}}}
		r.Initialize(bridgetest.NoCapabilities)
		return r
	}
	return rt, runner("alice", "alice-token-1"), runner("bob", "bob-token-1")
}

// per_user: each user's calls reach a process of their own, which holds
// that user's credential only; a changed credential moves the user to a
// new process, and the old one stops.
func TestPerUserProcessesHoldTheirOwnCredential(t *testing.T) {
	_, alice, bob := perUserPair(t)
	alicePID, bobPID := who(t, alice).PID, who(t, bob).PID
	if alicePID == bobPID {
		t.Fatal("alice and bob share a process")
	}
	for r, want := range map[*bridgetest.Runner]string{alice: "TOKEN=alice-token-1", bob: "TOKEN=bob-token-1"} {
		env := envOf(t, r)
		if !slices.Contains(env, want) || strings.Contains(strings.Join(env, " "), map[string]string{"alice": "bob-token", "bob": "alice-token"}[r.User]) {
			t.Errorf("%s's process has %q", r.User, env)
		}
	}
	// alice's token was refreshed: her session moves to a new process.
	alice.Header.Set("Authorization", "Bearer alice-token-2")
	if r := alice.Send(http.MethodPost, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); r.StatusCode != http.StatusNotFound {
		t.Fatalf("a request with a new credential on the old process: %d, want 404", r.StatusCode)
	}
	alice.Initialize(bridgetest.NoCapabilities)
	if pid := who(t, alice).PID; pid == alicePID || pid == bobPID {
		t.Fatalf("alice's new process is %d", pid)
	}
	if env := envOf(t, alice); !slices.Contains(env, "TOKEN=alice-token-2") {
		t.Fatalf("alice's new process has %q", env)
	}
	waitFor(t, "alice's old process stops", func() bool { return errors.Is(syscall.Kill(alicePID, 0), syscall.ESRCH) })
	if who(t, bob).PID != bobPID {
		t.Fatal("bob's process changed")
	}
}

// A process unused for the idle timeout stops; the next request starts a
// new one.
func TestIdleProcessStops(t *testing.T) {
	s := testSpec(t, stdioserver.ModeServe)
	s.Idle = 200 * time.Millisecond
	rt := start(t, s, nil)
	alice := runnerOf(t, rt, "alice")
	pid := who(t, alice).PID
	waitFor(t, "the idle process stops", func() bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) })
	assertGone(t, pid)
	if r := alice.Send(http.MethodPost, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); r.StatusCode != http.StatusNotFound {
		t.Fatalf("a request after the idle stop: %d, want 404", r.StatusCode)
	}
	alice = runnerOf(t, rt, "alice")
	if again := who(t, alice).PID; again == pid {
		t.Fatal("the stopped process answered")
	}
}

// What the program writes to stderr reaches the log, without the
// service's secrets and bounded in lines per window.
func TestStderrIsLoggedRedactedAndBounded(t *testing.T) {
	advance := fakeClock(t)
	core, logs := observer.New(zap.InfoLevel)
	rt := start(t, testSpec(t, stdioserver.ModeServe), zap.New(core))
	alice := runnerOf(t, rt, "alice")
	ready := func() bool {
		return logs.FilterMessage("program stderr").FilterField(zap.String("line", "stdio test server ready; secret in env: [redacted]")).Len() == 1
	}
	waitFor(t, "the startup line is logged, redacted", ready)
	p := rt.workers[""].proc
	before := p.stderrLines.Load()
	callTool(alice, 1, "shout", `{"text":"again and again","count":500}`)
	waitFor(t, "stderr is read", func() bool { return p.stderrLines.Load() == before+500 })
	if n := logs.FilterMessage("program stderr").Len(); n != stderrBudget {
		t.Fatalf("%d lines logged, want %d", n, stderrBudget)
	}
	advance(stderrWindow)
	callTool(alice, 2, "shout", `{"text":"a new window","count":1}`)
	waitFor(t, "the drop is reported", func() bool { return logs.FilterMessage("program wrote more to stderr than is logged").Len() == 1 })
	if n := logs.FilterMessage("program wrote more to stderr than is logged").All()[0].ContextMap()["lines_dropped"]; n != before+500-stderrBudget {
		t.Errorf("lines_dropped %v, want %d", n, before+500-stderrBudget)
	}
	for _, e := range logs.All() {
		if strings.Contains(fmt.Sprint(e.ContextMap()), testSecret) {
			t.Fatalf("the secret reached the log: %v", e.ContextMap())
		}
	}
}

// A secret in a line longer than what is logged of it is redacted, not cut
// into a prefix that escapes redaction: on stderr, where a long line is read
// in parts, and on stdout, where a line that is not a message is logged cut.
func TestLongLinesAreRedactedWhereCut(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	rt := start(t, testSpec(t, stdioserver.ModeServe), zap.New(core))
	alice := runnerOf(t, rt, "alice")
	for i, stream := range []string{"stderr", "stdout"} {
		for _, pad := range []int{maxLogLine - len(testSecret)/2, maxLogLine - 1, maxLogLine + 3} {
			text := strings.Repeat("x", pad) + testSecret + " tail"
			args := fmt.Sprintf(`{"text":%q,"count":1,"stdout":%v}`, text, stream == "stdout")
			if res := callTool(alice, 10*i+pad, "shout", args); bridgetest.ToolText(res) != "shouted" {
				t.Fatalf("shout: %s", res)
			}
		}
	}
	waitFor(t, "the lines are logged", func() bool {
		return logs.FilterMessage("program stderr").FilterFieldKey("line").Filter(func(e observer.LoggedEntry) bool {
			return strings.HasPrefix(e.ContextMap()["line"].(string), "xxx")
		}).Len() == 3 && logs.FilterMessage("program wrote a line that is not a JSON-RPC message to its stdout").Len() == 3
	})
	prefix := testSecret[:6]
	for _, e := range logs.All() {
		line, _ := e.ContextMap()["line"].(string)
		if strings.Contains(line, prefix) {
			t.Errorf("%q: a part of the secret reached the log: …%s", e.Message, line[max(len(line)-40, 0):])
		}
	}
}

// Resource limits are set on the process.
func TestLimitsAreSet(t *testing.T) {
	s := testSpec(t, stdioserver.ModeServe)
	s.Limits = Limits{Memory: 3 << 30, OpenFiles: 200}
	rt := start(t, s, nil)
	pid := who(t, runnerOf(t, rt, "alice")).PID
	limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range [][]string{{"Max data size", "3221225472", "3221225472"}, {"Max open files", "200", "200"}} {
		found := false
		for _, line := range strings.Split(string(limits), "\n") {
			if strings.HasPrefix(line, want[0]) {
				f := strings.Fields(strings.TrimPrefix(line, want[0]))
				found = len(f) >= 2 && f[0] == want[1] && f[1] == want[2]
			}
		}
		if !found {
			t.Errorf("no %q limit of %s:\n%s", want[0], want[1], limits)
		}
	}
}

// run_as runs the program as another user.
func TestRunAs(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("TOOLGATE_REQUIRE_PEERS") != "" {
			t.Fatal("run_as needs the tests to run as root")
		}
		t.Skip("run_as needs the tests to run as root")
	}
	u, err := lookupUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	// A copy of the test binary that nobody may run.
	dir, err := os.MkdirTemp("", "toolgate-run-as-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := testSpec(t, stdioserver.ModeServe)
	bin := filepath.Join(dir, "server")
	data, err := os.ReadFile(s.Command[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	s.Command[0], s.user, s.RunAs = bin, u, "nobody"
	rt := start(t, s, nil)
	if w := who(t, runnerOf(t, rt, "alice")); w.UID != int(u.uid) {
		t.Fatalf("the program runs as uid %d, want nobody's %d", w.UID, u.uid)
	}
}

// A user's process stops when their connection is found gone, unless they
// connected again and a request of theirs gave their worker the new
// credential between that read and the stop: the new process goes on.
func TestConnectionGoneSparesAProcessOfANewConnection(t *testing.T) {
	rt, alice, bob := perUserPair(t)
	alicePID, bobPID := who(t, alice).PID, who(t, bob).PID
	everyone := func(string) bool { return true }

	// alice's connection is read as gone; before the stop, she connected
	// again and her next request started a process with the new token.
	var newPID int
	rt.stopGone(rt.holding(everyone), func(user string) (string, error) {
		if user == "alice" {
			alice.Header.Set("Authorization", "Bearer alice-token-2")
			alice.Initialize(bridgetest.NoCapabilities)
			newPID = who(t, alice).PID
			return "", nil
		}
		return "bob-token-1", nil // bob is still connected
	})
	if newPID == alicePID {
		t.Fatal("alice's new token did not start a new process")
	}
	if pid := who(t, alice).PID; pid != newPID {
		t.Fatalf("alice's process with her new token was stopped: now %d, was %d", pid, newPID)
	}
	if env := envOf(t, alice); !slices.Contains(env, "TOKEN=alice-token-2") {
		t.Fatalf("alice's process has %q", env)
	}
	if who(t, bob).PID != bobPID {
		t.Fatal("bob's process changed")
	}

	// Read as gone with nothing in between, a process stops.
	rt.stopGone(rt.holding(func(user string) bool { return user == "alice" }), func(string) (string, error) { return "", nil })
	waitFor(t, "alice's process stops", func() bool { return errors.Is(syscall.Kill(newPID, 0), syscall.ESRCH) })
	if st := rt.workerState("alice"); st != stateClosed {
		t.Fatalf("alice's worker is still listed (state %d)", st)
	}
	// A storage that cannot be read stops nothing.
	rt.stopGone(rt.holding(everyone), func(string) (string, error) { return "", errors.New("storage unreachable") })
	if who(t, bob).PID != bobPID {
		t.Fatal("bob's process changed on a failed read")
	}
}

// A variable of the program's environment whose placeholder is empty (the
// gateway's own variable not set) is warned about, naming both and never a
// value: the program would otherwise start without its token.
func TestEmptyEnvironmentPlaceholderIsWarned(t *testing.T) {
	t.Setenv("TOOLGATE_TEST_STDIO_SET", "s3cret-value")
	core, logs := observer.New(zap.InfoLevel)
	tr := &Transport{
		Command: []string{"server"},
		Env: map[string]string{
			"GITHUB_TOKEN": "{env.TOOLGATE_TEST_STDIO_UNSET}",
			"API_KEY":      "{env.TOOLGATE_TEST_STDIO_SET}",
		},
		logger: zap.New(core),
	}
	tr.expand(caddy.NewReplacer())
	warned := logs.FilterMessageSnippet("environment is empty").All()
	if len(warned) != 1 {
		t.Fatalf("%d warnings, want 1: %v", len(warned), logs.All())
	}
	if f := warned[0].ContextMap(); f["env"] != "GITHUB_TOKEN" || f["placeholder"] != "{env.TOOLGATE_TEST_STDIO_UNSET}" {
		t.Fatalf("the warning names %v", f)
	}
	if tr.Env["API_KEY"] != "s3cret-value" || tr.Env["GITHUB_TOKEN"] != "" {
		t.Fatalf("expanded to %v", tr.Env)
	}
}
