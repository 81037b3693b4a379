package integration

// Resource exhaustion by one authenticated but hostile user (or a hostile
// upstream): what one caller can make the gateway keep — memory, storage
// rows and bytes, goroutines, file descriptors, CPU spent for others — and
// whether each is bounded per caller and freed when it ends.
//
// Tests whose comment starts with "Attack" describe what an attack would
// get through without the defence the test checks (each failed before its
// fix); those starting with "Holds" check a bound that holds.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/mcpsession"
)

// exOpenFDs counts this process's open file descriptors (the gateway runs
// in the test process).
func exOpenFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(entries)
}

// exGoroutines counts this process's goroutines, leaving out certmagic's
// file-lock refreshers, which sleep up to 5 s after their lock is released.
func exGoroutines() int {
	runtime.GC()
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.HasPrefix(g, "goroutine ") && !strings.Contains(g, "certmagic.keepLockfileFresh") {
			n++
		}
	}
	return n
}

// exStorageUnder counts the files under prefix in the gateway's
// file_system storage, and their bytes.
func exStorageUnder(t *testing.T, g *gateway, prefix string) (files int, bytes int64) {
	t.Helper()
	root := filepath.Join(g.DataDir, filepath.FromSlash(prefix))
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			files++
			bytes += info.Size()
		}
		return nil
	})
	return files, bytes
}

// exFiller is n bytes of text that differ by tag.
func exFiller(tag string, n int) string {
	return tag + strings.Repeat("x", n-len(tag))
}

// Attack: one requester makes any number of pending approvals. Every ask
// with other arguments creates a new record (internal/approval/manager.go:363,
// Manager.Resolve → Store.Create at internal/approval/approval.go:289) with
// the arguments and their masked copy sealed in it, plus three index rows;
// nothing counts a requester's pending approvals. Each step (one tools/call
// of 32 KiB arguments) adds 4 storage rows and about 3.6× the arguments in
// bytes, kept for the approval's ttl (10 minutes by default, up to 24h) and
// the record a day longer. At max_request_size (4 MiB) one runner adds
// ~14 MiB of storage per call, without limit. The defence: a per-requester
// bound on pending approvals (like max_sessions_per_user, 100 by default),
// refused with a retryable error past it.
func TestExhaustionAttackPendingApprovalsUnboundedPerRequester(t *testing.T) {
	_, g := approvalsGateway(t, "")
	alice := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	alice.initialize()
	const asks, argBytes = 150, 32 << 10
	filesBefore, bytesBefore := exStorageUnder(t, g, "toolgate")
	pendingAnswers, refused := 0, 0
	for i := range asks {
		args, _ := json.Marshal(map[string]string{"text": exFiller(fmt.Sprintf("spam-%d-", i), argBytes)})
		answer := alice.call(i+1, "gated_tool", string(args))
		switch {
		case strings.Contains(string(answer), `"approval_required":true`):
			pendingAnswers++
		case strings.Contains(string(answer), "max_pending_per_user") && strings.Contains(string(answer), `"retryable":true`):
			refused++
		}
	}
	if pendingAnswers != 100 || refused != asks-100 {
		t.Errorf("%d asks: %d answered pending, %d refused as past max_pending_per_user; want 100 and %d", asks, pendingAnswers, refused, asks-100)
	}
	// Bob's calls are not counted against alice's.
	bob := g.raw(t, bobKey, g.createSession(t, bobKey, "svc"), "svc")
	bob.initialize()
	if answer := bob.call(1, "gated_tool", `{"text":"bob's own"}`); !strings.Contains(string(answer), `"approval_required":true`) {
		t.Errorf("bob's ask while alice is at her bound: %s", answer)
	}
	filesAfter, bytesAfter := exStorageUnder(t, g, "toolgate")
	resp := g.api(t, http.MethodGet, "/v1/approvals?role=requester&state=pending", aliceKey, nil)
	var list struct{ Approvals []json.RawMessage }
	if resp.StatusCode != http.StatusOK || json.Unmarshal(resp.Body, &list) != nil {
		t.Fatalf("alice's approvals: %d %s", resp.StatusCode, resp.Body)
	}
	t.Logf("%d asks of %d KiB: %d answered pending, %d pending approvals, storage +%d files, +%d KiB (%.1f× the arguments)",
		asks, argBytes>>10, pendingAnswers, len(list.Approvals), filesAfter-filesBefore, (bytesAfter-bytesBefore)>>10,
		float64(bytesAfter-bytesBefore)/float64(asks*argBytes))
	if len(list.Approvals) > 100 {
		t.Errorf("one requester holds %d pending approvals (%d KiB of storage); want a per-requester bound (at most 100)",
			len(list.Approvals), (bytesAfter-bytesBefore)>>10)
	}
}

// Attack: listing the approvals one may decide reads every pending
// approval of every user, sealed contents included. GET /v1/approvals
// (modules/api/approvals.go:81) and the console's Approvals page call
// Manager.Decidable (internal/approval/manager.go:578), which reads all of
// Store.Pending (internal/approval/approval.go:437 → list at :398: each
// record loaded whole, decoded and its HMAC checked over the sealed
// arguments) and only then drops those the caller may not decide. Each of
// alice's pending asks adds about 10× its arguments' size to what bob's
// own listing allocates, although he may decide none of them: with 40 asks
// of 256 KiB bob's one request allocates ~100 MiB, and with
// max_request_size arguments ~40 MiB per ask. The defence: an index of pending approvals by
// who may decide them (or records listed without their sealed contents),
// so that a listing reads only the caller's.
func TestExhaustionAttackApproverListReadsEveryonesSealedArguments(t *testing.T) {
	_, g := approvalsGateway(t, "")
	alice := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	alice.initialize()
	const asks, argBytes = 40, 256 << 10
	for i := range asks {
		args, _ := json.Marshal(map[string]string{"text": exFiller(fmt.Sprintf("spam-%d-", i), argBytes)})
		mustPend(t, alice.call(i+1, "gated_tool", string(args)))
	}
	listing := func() (allocated uint64, n int) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		resp := g.api(t, http.MethodGet, "/v1/approvals", bobKey, nil)
		runtime.ReadMemStats(&after)
		var list struct{ Approvals []json.RawMessage }
		if resp.StatusCode != http.StatusOK || json.Unmarshal(resp.Body, &list) != nil {
			t.Fatalf("bob's approvals: %d %s", resp.StatusCode, resp.Body)
		}
		return after.TotalAlloc - before.TotalAlloc, len(list.Approvals)
	}
	listing() // warm up
	allocated, n := listing()
	t.Logf("bob's GET /v1/approvals lists %d approvals and allocates %d KiB, after alice's %d asks of %d KiB", n, allocated>>10, asks, argBytes>>10)
	if n != 0 {
		t.Fatalf("bob may decide %d of alice's approvals", n)
	}
	if allocated > 4<<20 {
		t.Errorf("bob's listing of nothing allocated %d MiB: it reads every user's pending approvals with their sealed arguments", allocated>>20)
	}
}

// Attack: a runner stream kept for resumption keeps the whole request it
// answers — the runner's message, up to max_request_size — long after it
// can be resumed. When a runner drops a call's SSE stream after the
// upstream primed it (or sent any event with an id), the relay ends but
// runnerStream.release (modules/mcpproxy/stream.go:206) keeps it in the
// MCP session (Session.KeepStream)
// with its *gateway.Call; once the call's deadline passes it is no longer
// resumable, yet nothing calls ForgetStream: it stays until eight newer
// ones push it out or the session ends. The stream holds no connection and
// no goroutine, so max_streams and max_streams_per_caller do not count it.
// Each dropped call pins its request body: 8 per MCP session × 100
// sessions per caller × 4 MiB = 3.2 GiB for one caller, with nothing open.
// Here: 8 dropped calls of 2 MiB each pin ~16 MiB after their deadline.
// The defence: forget a kept stream at its deadline (a timer, or a sweep in
// Housekeep), keep only what resuming needs (not the message), and count
// kept bytes per caller.
func TestExhaustionAttackDroppedStreamsPinRequestsPastTheirDeadline(t *testing.T) {
	up := startUpstream(t)
	const marker = "HOLD-PRIMED"
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if r.Method != http.MethodPost || !strings.Contains(string(body), marker) {
			return false
		}
		sseStart(w)
		fmt.Fprint(w, "id: up-1\ndata:\n\n") // a priming event (SEP-1699)
		flush(w)
		<-r.Context().Done()
		return true
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "2s"})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	const calls, argBytes = 8, 2 << 20

	drop := func(i int) {
		args, _ := json.Marshal(map[string]string{"text": exFiller(fmt.Sprintf("%s-%d-", marker, i), argBytes)})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		resp, err := m.send(ctx, http.MethodPost, "application/json, text/event-stream",
			fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":%s}}`, 100+i, args), "")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("call %d: %d %s, want an SSE stream", i, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "id:") {
			t.Fatalf("call %d: first line %q %v, want the priming event's id", i, line, err)
		}
		// The runner goes away with the stream primed: resumable until
		// the call's deadline.
	}
	base, _ := inUse()
	for i := range calls {
		drop(i)
	}
	m.transport.(*http.Transport).CloseIdleConnections()
	time.Sleep(3 * time.Second) // past every call's deadline (timeout 2s): none can be resumed
	kept, _ := inUse()
	if status := m.delete(); status/100 != 2 {
		t.Fatalf("DELETE: %d", status)
	}
	time.Sleep(200 * time.Millisecond)
	ended, _ := inUse()
	pinned := int64(kept) - int64(ended)
	t.Logf("heap: %d MiB before, %d MiB with %d dropped calls of %d MiB past their deadline, %d MiB after DELETE: %d MiB pinned by the session",
		base>>20, kept>>20, calls, argBytes>>20, ended>>20, pinned>>20)
	if pinned > 4<<20 {
		t.Errorf("%d dropped calls past their deadline still pin %d MiB in their MCP session (their request bodies), outside max_streams",
			calls, pinned>>20)
	}
}

// Holds: MCP session churn frees what each session took. A runner that
// initializes and ends (DELETE) 100 sessions in turn, with
// max_mcp_sessions_per_caller 3 and max_mcp_sessions 5, is never refused
// (each DELETE gives its slot back, locally and in the storage's per-user
// index), and the gateway's goroutines and file descriptors return to
// where they were: no timer, stream or upstream connection outlives its
// session. (With file_system storage each storage lock leaves certmagic's
// keepLockfileFresh goroutine sleeping up to 5 s after it is released:
// those are not counted.)
func TestExhaustionHoldsMCPSessionChurnFreesSlotsGoroutinesAndFDs(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Extra: "max_mcp_sessions 5\nmax_mcp_sessions_per_caller 3"})
	session := g.createSession(t, aliceKey, "svc")
	churn := func(n int) {
		for i := range n {
			m := g.raw(t, aliceKey, session, "svc")
			m.initialize()
			if status := m.delete(); status/100 != 2 {
				t.Fatalf("DELETE of session %d: %d", i, status)
			}
		}
		g.pool.CloseIdleConnections()
	}
	churn(10) // warm up pools and connections
	goroutinesBefore := exGoroutines()
	fdsBefore := exOpenFDs(t)
	churn(100)
	var goroutines, fds int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		g.pool.CloseIdleConnections()
		goroutines = exGoroutines()
		fds = exOpenFDs(t)
		if goroutines <= goroutinesBefore+10 && fds <= fdsBefore+10 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("after 100 sessions: goroutines %d → %d, fds %d → %d, upstream sessions open %d",
		goroutinesBefore, goroutines, fdsBefore, fds, len(up.openSessions()))
	if goroutines > goroutinesBefore+10 {
		t.Errorf("100 ended MCP sessions left %d goroutines", goroutines-goroutinesBefore)
	}
	if fds > fdsBefore+10 {
		t.Errorf("100 ended MCP sessions left %d file descriptors", fds-fdsBefore)
	}
	if open := up.openSessions(); len(open) > 0 {
		t.Errorf("%d upstream sessions were not ended", len(open))
	}
}

// Holds: a hostile upstream that sends server→client requests on the
// standalone stream faster than a runner answers (this one never answers)
// makes the gateway record at most MaxPendingServerRequests (256) of them
// per MCP session, in memory and as storage rows
// (toolgate/mcp/sessions/<ref>/pending/…); the rest are refused, not
// queued.
func TestExhaustionHoldsServerRequestFloodIsBoundedPerSession(t *testing.T) {
	up := startUpstream(t)
	const flood = 600
	sent := make(chan struct{})
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if r.Method != http.MethodGet {
			return false
		}
		sseStart(w)
		for i := range flood {
			fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":\"flood-%d\",\"method\":\"ping\"}\n\n", i)
		}
		flush(w)
		close(sent)
		<-r.Context().Done()
		return true
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := m.send(ctx, http.MethodGet, "text/event-stream", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET stream: %d", resp.StatusCode)
	}
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream's stream was never opened")
	}
	// Read what the runner is sent, without answering any of it.
	relayed := 0
	br := bufio.NewReader(resp.Body)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if strings.Contains(line, `"method":"ping"`) {
				relayed++
			}
		}
	}()
	time.Sleep(2 * time.Second)
	files, _ := exStorageUnder(t, g, "toolgate/mcp/sessions")
	cancel()
	<-readDone
	t.Logf("%d server requests from the upstream: %d relayed to the runner, %d files under the session's storage", flood, relayed, files)
	if relayed == 0 {
		t.Fatalf("no server request reached the runner: the test does not exercise the bound")
	}
	if relayed > mcpsession.MaxPendingServerRequests {
		t.Errorf("%d unanswered server requests relayed, want at most %d", relayed, mcpsession.MaxPendingServerRequests)
	}
	if files > mcpsession.MaxPendingServerRequests+8 {
		t.Errorf("%d storage rows for one session's unanswered server requests, want at most %d", files, mcpsession.MaxPendingServerRequests)
	}
}

// Holds: live toolgate sessions are bounded per caller. With
// max_sessions_per_user 5, alice's sixth POST /v1/sessions gets 429 and
// stores nothing, ending one makes room, and bob is not affected.
func TestExhaustionHoldsToolgateSessionsPerUser(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Extra: "max_sessions_per_user 5"})
	var ids []string
	for range 5 {
		ids = append(ids, g.createSession(t, aliceKey, "svc"))
	}
	before, _ := exStorageUnder(t, g, "toolgate/sessions")
	for range 20 {
		if resp := g.api(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(`{"services":["svc"]}`)); resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("alice's session past max_sessions_per_user: %d %s, want 429", resp.StatusCode, resp.Body)
		}
	}
	if after, _ := exStorageUnder(t, g, "toolgate/sessions"); after != before {
		t.Errorf("refused sessions changed storage: %d files, %d before", after, before)
	}
	g.createSession(t, bobKey, "svc")
	if resp := g.api(t, http.MethodDelete, "/v1/sessions/"+ids[0], aliceKey, nil); resp.StatusCode/100 != 2 {
		t.Fatalf("DELETE session: %d %s", resp.StatusCode, resp.Body)
	}
	g.createSession(t, aliceKey, "svc")
}

// Attack: request bodies were bounded one at a time (max_request_size) but
// not together: a caller holding many large requests open at once — a
// Content-Length of max_request_size and the body sent slowly, or never
// finished — made the gateway hold each body (up to max_streams_per_caller
// of them, 1,000 by default: gigabytes) and could exhaust its memory for
// everyone. Room for each body is now held before it is read, per caller
// (max_request_bytes_in_flight_per_caller) and in all
// (max_request_bytes_in_flight); past either the request gets a retryable
// 503 naming the option, and room comes back as requests end.
func TestExhaustionAttackConcurrentLargeRequests(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Extra: "max_request_size 1MiB\n" +
		"max_request_bytes_in_flight_per_caller 2MiB\nmax_request_bytes_in_flight 3MiB"})
	// The bound in all is the process's: streams earlier tests' runners
	// dropped hold their requests' room until their calls' deadlines.
	if now, ok := settleBoundGauges(t, g, boundGauges{streams: math.Inf(1)}, 30*time.Second); !ok {
		t.Fatalf("request bytes held by earlier tests never came back: %v", now)
	}
	alice := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	alice.initialize()
	bob := g.raw(t, bobKey, g.createSession(t, bobKey, "svc"), "svc")
	bob.initialize()

	// stall opens a request of m's whose body never comes: with a
	// Content-Length of 1 MiB, or without one (chunked, counted as
	// max_request_size while it is read).
	stall := func(m *rawMCP, key string, chunked bool) net.Conn {
		conn := dialGateway(t, g)
		length := "Content-Length: 1048576\r\n"
		if chunked {
			length = "Transfer-Encoding: chunked\r\n"
		}
		fmt.Fprintf(conn, "POST /v1/mcp/svc HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nX-Toolgate-Session: %s\r\n"+
			"Mcp-Session-Id: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n%s\r\n",
			strings.TrimPrefix(g.URL, "http://"), key, m.headers["X-Toolgate-Session"], m.sessionID, length)
		const part = `{"jsonrpc":"2.0",`
		if chunked {
			fmt.Fprintf(conn, "%x\r\n%s\r\n", len(part), part)
		} else {
			fmt.Fprint(conn, part)
		}
		return conn
	}
	// until sends small calls of m until one is answered as want says (or
	// 100 tries), and returns the last answer.
	until := func(m *rawMCP, want func(status int, body string) bool) (int, string) {
		return pingUntil(t, m, 100, "", want)
	}
	refusedFor := func(option string) func(int, string) bool {
		return func(status int, body string) bool {
			return status == http.StatusServiceUnavailable && strings.Contains(body, `"limit":"`+option+`"`) && strings.Contains(body, `"retryable":true`)
		}
	}
	served := func(status int, _ string) bool { return status == http.StatusOK }

	// A stalled request is counted once the gateway has read its headers;
	// a ping of the same caller in flight at that moment can take the room
	// it needs (and it is refused, unseen, as the ping would be): each
	// stall is given a moment, and made again if it was refused.
	var a1, a2 net.Conn
	for try := 0; ; try++ {
		a1, a2 = stall(alice, aliceKey, false), stall(alice, aliceKey, true)
		time.Sleep(200 * time.Millisecond)
		status, body := until(alice, refusedFor("max_request_bytes_in_flight_per_caller"))
		if refusedFor("max_request_bytes_in_flight_per_caller")(status, body) {
			break
		}
		if try == 4 {
			t.Fatalf("alice holding 2 MiB of bodies in flight, her next request: %d %s", status, body)
		}
		a1.Close()
		a2.Close()
	}
	if status, body := until(bob, served); status != http.StatusOK {
		t.Fatalf("bob, while alice is at her bound: %d %s", status, body)
	}
	for try := 0; ; try++ {
		time.Sleep(200 * time.Millisecond) // bob's last ping may hold its room a moment after its answer
		b1 := stall(bob, bobKey, false)
		time.Sleep(200 * time.Millisecond)
		status, body := until(bob, refusedFor("max_request_bytes_in_flight"))
		if refusedFor("max_request_bytes_in_flight")(status, body) {
			break
		}
		if try == 4 {
			t.Fatalf("with 3 MiB of bodies in flight, bob's next request: %d %s", status, body)
		}
		b1.Close()
	}
	a1.Close()
	a2.Close()
	if status, body := until(alice, served); status != http.StatusOK {
		t.Fatalf("alice, once her stalled requests ended: %d %s", status, body)
	}
	if n := up.upstreamCalls("echo"); n != 0 {
		t.Errorf("the upstream saw %d calls from bodies never sent", n)
	}
}

// pingIDs numbers the pings of pingUntil: a session's request ids are
// never used twice.
var pingIDs atomic.Int64

// pingUntil sends m's pings (with pad in their _meta when not "") until one
// is answered as want says, or tries run out, and returns the last answer.
func pingUntil(t *testing.T, m *rawMCP, tries int, pad string, want func(status int, body string) bool) (int, string) {
	t.Helper()
	meta := ""
	if pad != "" {
		meta = fmt.Sprintf(`,"params":{"_meta":{"pad":%q}}`, pad)
	}
	var status int
	var body string
	for range tries {
		resp, err := m.send(context.Background(), http.MethodPost, "application/json, text/event-stream",
			fmt.Sprintf(`{"jsonrpc":"2.0","id":"ping-%d","method":"ping"%s}`, pingIDs.Add(1), meta), "")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		status, body = resp.StatusCode, string(b)
		if want(status, body) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return status, body
}

// Attack: a stream the runner dropped is kept until its call's deadline so
// that the runner can resume it, and it keeps the runner's request with
// it; its body's room was given back as the request ended all the same. A
// runner calling a tool whose stream can be resumed, with a body near
// max_request_size each time, and dropping each stream at its first event,
// made the gateway hold body after body past
// max_request_bytes_in_flight_per_caller (every dropped call's, for as long
// as its deadline). A kept stream now holds its request's room until it is
// forgotten: resumed to its answer, or at its deadline.
func TestExhaustionAttackDroppedStreamsKeepTheirRequests(t *testing.T) {
	_, g, m := aliceSession(t, gatewayConfig{Timeout: "6s",
		Extra: "max_request_size 1MiB\nmax_request_bytes_in_flight_per_caller 2MiB"})
	pad := strings.Repeat("p", 900<<10)
	// drop calls the progress tool with a 900 KiB body, reads its stream
	// up to the first progress, drops it, and returns the id of the last
	// event read.
	drop := func(id int) string {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		resp, err := m.send(ctx, http.MethodPost, "application/json, text/event-stream", fmt.Sprintf(
			`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"progress","arguments":{"steps":10},"_meta":{"progressToken":"p%d","pad":%q}}}`,
			id, id, pad), "")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("call %d: %d %s", id, resp.StatusCode, b)
		}
		lines := bufio.NewReader(resp.Body)
		lastID := ""
		for {
			line, err := lines.ReadString('\n')
			if err != nil {
				t.Fatalf("call %d: the stream ended before any progress: %v", id, err)
			}
			if v, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "id: "); ok {
				lastID = v
			}
			if strings.Contains(line, `"progress":1`) {
				break
			}
		}
		if lastID == "" {
			t.Fatalf("call %d: the progress event had no id", id)
		}
		return lastID
	}
	// ping sends a ping with a 900 KiB body until one is answered as want
	// says (or tries run out), and returns the last answer.
	ping := func(tries int, want func(status int, body string) bool) (int, string) {
		return pingUntil(t, m, tries, pad, want)
	}
	refused := func(status int, body string) bool {
		return status == http.StatusServiceUnavailable && strings.Contains(body, `"limit":"max_request_bytes_in_flight_per_caller"`)
	}
	served := func(status int, _ string) bool { return status == http.StatusOK }

	a := drop(1)
	drop(2)
	// The gateway learns of each drop as it reads the connection's end: a
	// ping is given a few tries.
	if status, body := ping(40, refused); !refused(status, body) {
		t.Fatalf("with two dropped streams of 900 KiB requests kept, a third 900 KiB request: %d %.300s, want 503 naming max_request_bytes_in_flight_per_caller", status, body)
	}
	// An operator sees the bound reached (and the dashboard charts it).
	requireMetrics(t, g, refusalMetricName, "toolgate_request_bytes_in_flight", "toolgate_streams_open")
	// Resumed to its answer, a stream gives its room back at once.
	resumed, err := m.send(context.Background(), http.MethodGet, "text/event-stream", "", a)
	if err != nil || resumed.StatusCode != http.StatusOK {
		t.Fatalf("GET with Last-Event-ID %q: %v %v", a, err, resumed)
	}
	rest, _ := io.ReadAll(resumed.Body)
	resumed.Body.Close()
	if !strings.Contains(string(rest), `"text":"done"`) {
		t.Fatalf("the resumed stream = %q, want the answer", rest)
	}
	if status, body := ping(10, served); status != http.StatusOK {
		t.Fatalf("once one of the two was resumed to its answer, a 900 KiB request: %d %.300s", status, body)
	}
	// The other's room comes back at its deadline (6s after its call).
	drop(3)
	if status, body := ping(40, refused); !refused(status, body) {
		t.Fatalf("with two dropped streams kept again, a 900 KiB request: %d %.300s, want 503", status, body)
	}
	if status, body := ping(200, served); status != http.StatusOK {
		t.Fatalf("after the first kept stream's deadline, a 900 KiB request: %d %.300s", status, body)
	}
}
