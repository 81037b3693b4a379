package stdio

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
	"github.com/toolgate/toolgate/internal/stdioserver"
)

// envHostile puts this test binary in a hostile program mode of this file's
// (checked in init, before TestMain).
const envHostile = "TOOLGATE_REVIEW_HOSTILE"

func init() {
	mode := os.Getenv(envHostile)
	if mode == "" {
		return
	}
	if mode == "token-gate" {
		// A server that checks its token when it starts, as many do
		// (github-mcp-server calls get_me): a bad one ends it at once.
		if strings.HasPrefix(os.Getenv("TOKEN"), "bad") {
			fmt.Fprintln(os.Stderr, "401 Bad credentials")
			os.Exit(1)
		}
		os.Exit(stdioserver.Main(stdioserver.ModeServe))
	}
	hostile(mode)
	os.Exit(0)
}

// hostile runs a misbehaving MCP server on stdin/stdout.
func hostile(mode string) {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	secret := os.Getenv("TEST_SECRET") + " " + os.Getenv("TOKEN")
	for in.Scan() {
		line := in.Bytes()
		id := gjson.GetBytes(line, "id").Raw
		method := gjson.GetBytes(line, "method").String()
		switch mode {
		case "ask-later":
			// A server whose tool answers at once and keeps working on the
			// caller's data, asking the client to sample about it a moment
			// later (a background job, a task).
			switch method {
			case "initialize":
				fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"asker","version":"1"}}}`+"\n", id)
			case "tools/call":
				who := gjson.GetBytes(line, "params.arguments.who").String()
				fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"started"}]}}`+"\n", id)
				go func() {
					time.Sleep(300 * time.Millisecond)
					fmt.Printf(`{"jsonrpc":"2.0","id":"srv-%s","method":"sampling/createMessage","params":{"messages":[{"role":"user","content":{"type":"text","text":"summarize the private notes of %s"}}],"maxTokens":10}}`+"\n", who, who)
				}()
			}
		case "brace-junk":
			// A server that answers, but first writes lines that begin
			// like a message and are not JSON (a debug print of a struct,
			// say), 2000 per call.
			switch method {
			case "initialize":
				fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"junk","version":"1"}}}`+"\n", id)
			case "tools/call":
				w := bufio.NewWriter(os.Stdout)
				for i := range 2000 {
					fmt.Fprintf(w, "{debug: state %d}\n", i)
				}
				fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"done"}]}}`+"\n", id)
				w.Flush()
			}
		case "refuse-init":
			// Refuses toolgate's initialize, naming the key it holds, as a
			// server that says which key was wrong does.
			if method == "initialize" {
				fmt.Printf(`{"jsonrpc":"2.0","id":%s,"error":{"code":-32000,"message":"invalid API key: %s"}}`+"\n", id, secret)
			}
		}
	}
	io.Copy(io.Discard, os.Stdin)
}

func hostileSpec(t *testing.T, mode string) *spec {
	s := testSpec(t, "")
	s.Env = append(s.Env, envHostile+"="+mode)
	s.StartTimeout = 5 * time.Second
	return s
}

// Attack (fixed): a program (or whatever answers as it: a bad key, a misconfigured
// server) refuses toolgate's initialize with an error message that names
// the secret it was given — the service's env value, or the per-user
// credential in credential_env ("invalid API key: <key>"). Expected: the
// secret reaches neither the log nor the runner, as for the program's
// stderr (logLine redacts it) and for a malformed message (link.go:422
// keeps "the server's own words" out of both). Happens: link.go:226 puts
// the program's message into the error, supervisor.go:478 makes it the
// process's why, process.go:430 (kill) and supervisor.go:522 log it
// unredacted, and supervisor.go:396 (downLocked) sends it to runners in the
// retryable "restarts it in …" error.
// Fixed: a server's refusal of initialize is named by its JSON-RPC code
// only (mcpbridge.Link.Initialize).
func TestReviewInitRefusalLeaksSecret(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	s := hostileSpec(t, "refuse-init")
	s.PerUser, s.CredEnv, s.CredHeader = true, "TOKEN", "Authorization"
	rt := start(t, s, zap.New(core))
	const token = "alice-personal-token-77"
	r := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice", Header: http.Header{"Authorization": {"Bearer " + token}}}
	resp := r.Send(http.MethodPost, `{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"runner","version":"1"}}}`)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// A second try lands in the restart backoff, whose error says why.
	resp2 := r.Send(http.MethodPost, `{"jsonrpc":"2.0","id":"init2","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"runner","version":"1"}}}`)
	body2, _ := io.ReadAll(resp2.Body)
	resp2.Body.Close()
	waitFor(t, "the refusal is logged", func() bool { return logs.FilterMessage("program ended; restarting it").Len() > 0 })
	for _, b := range [][]byte{body, body2} {
		if strings.Contains(string(b), testSecret) || strings.Contains(string(b), token) {
			t.Errorf("the runner's answer holds the program's secret: %s", b)
		}
	}
	for _, e := range logs.All() {
		if m := fmt.Sprint(e.ContextMap()); strings.Contains(m, testSecret) || strings.Contains(m, token) {
			t.Errorf("log %q holds the secret: %s", e.Message, m)
		}
	}
}

// Attack (fixed): on a per_user service with max_processes 2, alice keeps a call in
// progress (a long tool) and stores a new token: her old process retires,
// finishing the call, beside her new one (another runner of hers uses the
// new token) (2 processes, at the bound); then
// bob connects. Expected: "max_processes … A process replaced because its
// user's credential changed … (it counts)" (README): bob gets a retryable
// error or an idle process is stopped for him; never 3 processes. Happens:
// runtime.worker (supervisor.go:158) bounds len(rt.workers), not the
// processes alive (rt.procs, which retireLocked at supervisor.go:435 does
// count), so bob gets a third process: the bound holds per worker, and
// retiring processes add to it.
// Fixed: max_processes counts the processes retiring beside the workers
// (runtime.placesLocked).
func TestReviewRetiringProcessesEscapeMaxProcesses(t *testing.T) {
	s := testSpec(t, "serve")
	s.PerUser, s.CredEnv, s.CredHeader, s.MaxProcs = true, "TOKEN", "Authorization", 2
	rt := start(t, s, nil)
	alice := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice", Header: http.Header{"Authorization": {"Bearer alice-token-1"}}}
	alice.Initialize(bridgetest.NoCapabilities)
	oldPID := who(t, alice).PID
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	callDone := make(chan struct{})
	go func() {
		defer close(callDone)
		resp := alice.SendCtx(ctx, http.MethodPost, `{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"wait","arguments":{}}}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}()
	waitFor(t, "alice's call is in progress", func() bool { busy, _ := rt.workers["alice"].busy(); return busy })
	// Another runner of alice's, with her refreshed token.
	alice2 := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice", Header: http.Header{"Authorization": {"Bearer alice-token-2"}}}
	alice2.Initialize(bridgetest.NoCapabilities)
	if pid := who(t, alice2).PID; pid == oldPID {
		t.Fatal("alice was not moved to a new process")
	}
	if syscall.Kill(oldPID, 0) != nil {
		t.Fatal("alice's old process stopped at once: the scenario needs it retiring")
	}
	bob := &bridgetest.Runner{T: t, RT: rt.bridge, User: "bob", Header: http.Header{"Authorization": {"Bearer bob-token-1"}}}
	bob.Initialize(bridgetest.NoCapabilities)
	if n := rt.procs.Load(); n > int64(s.MaxProcs) {
		t.Errorf("%d processes alive on a service with max_processes %d", n, s.MaxProcs)
	}
	cancel()
	<-callDone
}

// Attack (fixed): none needed — routine use. A runner has a long tool call in
// progress on a per_user process holding credential_env; toolgate
// refreshes the user's OAuth token (or the user stores a new one), and the
// runner's next request of the same session carries it. Expected (README
// "Programs and legacy SSE servers": "when the credential changes …, new
// requests go to a new process, and the old one stops once its requests
// are answered"): the call in progress runs to its answer. Happens:
// Bridge.RoundTrip (internal/mcpbridge/bridge.go:229-231) ends the whole
// session on the first request with another credential: Session.end
// (session.go) sends notifications/cancelled for each call in progress
// and finishes its stream with no JSON-RPC answer, so the old process,
// idle at once, is stopped and the call is lost (the runner gets an empty
// answer, not even a retryable error).
// Fixed: a session whose caller's credential changed is forgotten and ends
// once its requests in progress are answered (mcpbridge Session.retire).
func TestReviewCredentialChangeCancelsCallInProgress(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	s := testSpec(t, "serve")
	s.PerUser, s.CredEnv, s.CredHeader = true, "TOKEN", "Authorization"
	rt := start(t, s, zap.New(core))
	alice := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice", Header: http.Header{"Authorization": {"Bearer alice-token-1"}}}
	alice.Initialize(bridgetest.NoCapabilities)
	oldPID := who(t, alice).PID
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	answer := make(chan string, 1)
	header := alice.Header.Clone()
	go func() {
		r := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice", Header: header, Session: alice.Session}
		resp := r.SendCtx(ctx, http.MethodPost, `{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"wait","arguments":{}}}`)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answer <- string(b)
	}()
	waitFor(t, "alice's call is in progress", func() bool { busy, _ := rt.workers["alice"].busy(); return busy })
	alice.Header.Set("Authorization", "Bearer alice-token-2") // refreshed
	resp := alice.Send(http.MethodPost, `{"jsonrpc":"2.0","id":2,"method":"ping"}`)
	resp.Body.Close()
	select {
	case b := <-answer:
		cancelledThere := false
		for range 100 { // the program's own word that it was told to stop
			if cancelledThere = logs.FilterField(zap.String("line", "wait was cancelled")).Len() > 0; cancelledThere {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("the call in progress ended when the credential changed (answer %q); the program logged \"wait was cancelled\": %v",
			b, cancelledThere)
	case <-time.After(2 * time.Second):
		// Still running, as promised.
	}
	if syscall.Kill(oldPID, 0) != nil {
		t.Errorf("the old process %d stopped while a call was in progress on it", oldPID)
	}
	cancel()
}

// Attack (fixed): none needed — routine use. A user's token was revoked, so their
// per_user program (which checks its token at start, as github-mcp-server
// does) exits with status 1; the user connects the service again with a
// good token and retries. Expected: their next requests start a process
// with the new credential (a changed credential moves the user to a new
// process, README), within the restart backoff at worst. Happens:
// worker.ready (supervisor.go:357-360) answers every request in
// stateBackoff with the restart error without looking at the credential,
// and worker.restart (supervisor.go:540) starts the next process with
// w.cred, the revoked token; a request arriving while it starts waits for
// it and gets the next backoff. As long as the user keeps trying
// (lastUse stays fresh, so restart's idle check never resets the worker)
// the new token is never used: the user is locked out, and the program is
// handed a credential the user replaced, again and again.
// Fixed: a worker waiting to restart starts at once with a credential other
// than the one it keeps ending with (worker.ready).
func TestReviewBackoffKeepsRestartingWithReplacedCredential(t *testing.T) {
	s := hostileSpec(t, "token-gate")
	s.PerUser, s.CredEnv, s.CredHeader = true, "TOKEN", "Authorization"
	rt := start(t, s, nil)
	initialize := func(token string) (session string, body string) {
		r := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice", Header: http.Header{"Authorization": {"Bearer " + token}}}
		resp := r.Send(http.MethodPost, `{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"runner","version":"1"}}}`)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.Header.Get("Mcp-Session-Id"), string(b)
	}
	if sid, body := initialize("bad-token-revoked"); sid != "" {
		t.Fatalf("a program with a bad token initialized: %s", body)
	}
	// alice connected again with a good token; her runner retries for
	// about 8 s (restarts at 250 ms, 500 ms, 1 s, 2 s, 4 s).
	deadline := time.Now().Add(5 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		sid, body := initialize("good-token-1")
		if sid != "" {
			return
		}
		last = body
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("with a good token for 5 s, alice still gets: %s (restarts: %v)", last, rt.schedule())
}

// Attack (fixed): a program writes, per call, 2000 stdout lines that begin with
// "{" but are not JSON ("{debug: state 7}"). Expected (README: "A line that
// is not JSON is logged and skipped … at most 200 lines per 10 s … the
// same budget holds for stdout lines that are not JSON"): at most 200 such
// log entries per 10 s. Happens: readMessages (process.go:252-253) hands
// every line starting with '{' to link.Receive without taking from the
// budget, and Link.Receive (internal/mcpbridge/link.go:428) logs a Warn
// "dropped a malformed message from the server" for each: the log budget
// that bounds other junk is bypassed, one entry per line, without bound.
// Fixed: lines that begin like a message and do not parse take from the
// stdout log budget (LinkConfig.MayLog).
func TestReviewBraceJunkBypassesLogBudget(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	s := hostileSpec(t, "brace-junk")
	rt := start(t, s, zap.New(core))
	r := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice"}
	r.Initialize(bridgetest.NoCapabilities)
	if got := bridgetest.ToolText(callTool(r, 1, "x", "{}")); got != "done" {
		t.Fatalf("call: %q", got)
	}
	n := logs.FilterMessage("dropped a malformed message from the server").Len() +
		logs.FilterMessage("program wrote a line that is not a JSON-RPC message to its stdout").Len()
	if n > stderrBudget {
		t.Errorf("one call put %d log entries for stdout junk (budget: %d per %v)", n, stderrBudget, stderrWindow)
	}
}

// Attack (fixed): on a shared program (no per_user), bob calls a tool that answers
// at once and goes on working on his data, then sends a server→client
// request (sampling/createMessage, whose prompt holds bob's data). Bob's
// runner either has no standalone stream open, or has one but did not
// declare sampling; alice has a standalone stream open and declared
// sampling. Expected (README: a server→client request goes "only to a
// runner that declared the capability and whose call can be told from
// other people's"; routeLocked's own rule for calls: "Every person … counts,
// whether or not their runner could take the message … it must not go to
// someone else"): refused — two users are connected to the program.
// Happens: with no call in progress, Link.routeLocked
// (internal/mcpbridge/link.go:599-607) counts only users whose session
// declared the capability and has a standalone stream open (the caps check
// and the s.get check come before users[s.User] = true), so bob does not
// count and alice's runner — her LLM — gets bob's request and its data.
// Fixed: with no call in progress, every connected person counts, whether
// or not their runner could take the message (Link.routeLocked).
func TestReviewServerRequestReachesAnotherUser(t *testing.T) {
	for _, bobStream := range []bool{false, true} {
		t.Run(fmt.Sprintf("bob_stream=%v", bobStream), func(t *testing.T) {
			rt := start(t, hostileSpec(t, "ask-later"), nil)
			alice := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice"}
			alice.Initialize(bridgetest.Sampling)
			bob := &bridgetest.Runner{T: t, RT: rt.bridge, User: "bob"}
			if bobStream {
				bob.Initialize(bridgetest.NoCapabilities)
			} else {
				bob.Initialize(bridgetest.Sampling)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			get := alice.SendCtx(ctx, http.MethodGet, "")
			defer get.Body.Close()
			aliceEvents := bridgetest.Events(get.Body)
			if bobStream {
				bget := bob.SendCtx(ctx, http.MethodGet, "")
				defer bget.Body.Close()
				go func() { _, _ = io.Copy(io.Discard, bget.Body) }()
			}
			time.Sleep(100 * time.Millisecond) // the streams are open
			if got := bridgetest.ToolText(callTool(bob, 1, "job", `{"who":"bob"}`)); got != "started" {
				t.Fatalf("bob's call: %q", got)
			}
			select {
			case msg := <-aliceEvents:
				if strings.Contains(msg, "bob") {
					t.Errorf("alice's runner got bob's server request: %s", msg)
				}
			case <-time.After(2 * time.Second):
			}
		})
	}
}
