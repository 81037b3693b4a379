// Tests whose comment starts with "Attack" describe what an attack would get through without the defence the test checks (each failed before its fix); those starting with "Holds" show attacks the design resists.

package integration

// Resumption of runner streams (GET with Last-Event-ID) and the accounting
// of request bodies, attacked: a runner resuming its own streams at the
// worst moments (while the answer is being written, at the deadline, in a
// loop, after its session ended), another caller's stream ids, an upstream
// that answers twice and numbers events after its answer, request bodies
// whose Content-Length lies, a federated runner going away. Each test runs
// as a caller of its own (acctUser) and compares the gauges with their
// value at its start.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// ---- helpers ---------------------------------------------------------------

// raSmallReads is a transport that keeps no connection alive and reads
// through a small socket receive buffer: a runner that stops reading its
// stream makes the gateway's writes block soon.
func raSmallReads() *http.Transport {
	return &http.Transport{DisableKeepAlives: true, ReadBufferSize: 512,
		DialContext: (&net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
			var err error
			if cerr := c.Control(func(fd uintptr) {
				err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			}); cerr != nil {
				return cerr
			}
			return err
		}}).DialContext}
}

// raRead reads r in small pieces until done says the text read so far is
// enough, and returns that text. It fails the test when r ends first.
func raRead(t *testing.T, r io.Reader, what string, done func(text string) bool) string {
	t.Helper()
	var sb strings.Builder
	buf := make([]byte, 256)
	for !done(sb.String()) {
		n, err := r.Read(buf)
		sb.Write(buf[:n])
		if err != nil && !done(sb.String()) {
			t.Fatalf("the stream ended before %s: %v; read %.500q", what, err, sb.String())
		}
	}
	return sb.String()
}

// raLastID is the value of the last complete "id: " line of an SSE text
// ("" for none).
func raLastID(text string) string {
	id := ""
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		if i == len(lines)-1 {
			break // not complete yet
		}
		if v, ok := strings.CutPrefix(strings.TrimSuffix(line, "\r"), "id: "); ok {
			id = v
		}
	}
	return id
}

// raHasID reports whether text holds a complete "id: " line.
func raHasID(text string) bool { return raLastID(text) != "" }

// raCancelled returns the ids of the requests the upstream was told to
// cancel (notifications/cancelled).
func raCancelled(up *upstream) []string {
	var ids []string
	for _, r := range up.requestLog() {
		if !strings.Contains(r.Body, `"notifications/cancelled"`) {
			continue
		}
		var msg struct {
			Params struct {
				RequestID json.RawMessage `json:"requestId"`
			} `json:"params"`
		}
		if json.Unmarshal([]byte(r.Body), &msg) == nil {
			ids = append(ids, string(msg.Params.RequestID))
		}
	}
	return ids
}

// raResumes counts the resumptions (GET with Last-Event-ID) the upstream
// received.
func raResumes(up *upstream) int {
	n := 0
	for _, r := range up.requestLog() {
		if r.Method == http.MethodGet && r.Header.Get("Last-Event-Id") != "" {
			n++
		}
	}
	return n
}

// raGet resumes m's stream from lastID and returns the status and the
// whole answer (bounded by ctx).
func raGet(ctx context.Context, m *rawMCP, lastID string) (int, string, error) {
	resp, err := m.send(ctx, http.MethodGet, "text/event-stream", "", lastID)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// raWaitCall is a tools/call of the upstream's wait tool (it works until
// it is cancelled, at most 10s) with the request id id.
func raWaitCall(id int, pad string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"wait","arguments":{},"_meta":{"pad":%q}}}`, id, pad)
}

// raProgressCall is a tools/call of the upstream's progress tool (a
// notification every 20ms, then "done") with the request id id.
func raProgressCall(id, steps int, pad string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"progress","arguments":{"steps":%d},"_meta":{"progressToken":"rp%d","pad":%q}}}`,
		id, steps, id, pad)
}

// ---- attacks ---------------------------------------------------------------

// Attack: a runner keeps upstream calls working past the service timeout,
// and more of them than max_streams_per_caller lets it have, by dropping
// each call's stream after its first event id. A dropped stream that can
// be resumed ends its relay quietly (relay: "the runner may resume the
// stream"), gives its stream place back and is kept in the MCP session;
// when its call's deadline passes, runnerStream.release's timer forgets it
// (runnerStream.forget, modules/mcpproxy/resume.go) — and nothing ever
// tells the upstream: no notifications/cancelled, neither at the deadline
// nor when a ninth kept stream evicts it. A relay still running at the
// deadline does tell it ("the upstream did not answer in time"), and the
// README promises it for a timeout and for a runner whose stream cannot be
// resumed. Here three calls of wait (which works until cancelled) run on
// upstream, past a 2s timeout, while the caller (max_streams_per_caller 2)
// holds no place at all. Fix: when a kept stream is forgotten unsettled
// (at its deadline, evicted, its session ended), cancel its call upstream
// (h.cancelUpstream with the stream's call and upstream).
func TestResumeAttackDroppedStreamIsNeverCancelledUpstream(t *testing.T) {
	key, _, auth := acctUser("resume-uncancelled")
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "2s", AuthExtra: auth, Extra: "max_streams_per_caller 2"})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	const calls = 3
	sent := time.Now()
	for i := 1; i <= calls; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		resp, err := m.send(ctx, http.MethodPost, "application/json, text/event-stream", raWaitCall(700+i, ""), "")
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		raRead(t, resp.Body, "the stream's first event id", raHasID)
		cancel() // the runner drops the stream
		resp.Body.Close()
	}
	if now, back := settleBoundGauges(t, g, before, 3*time.Second); !back {
		t.Fatalf("after %d dropped streams, the gauges stay at %v (before: %v)", calls, now, before)
	}
	// Every deadline passes.
	wait := time.Until(sent.Add(2*time.Second)) + 3*time.Second
	var cancelled []string
	for end := time.Now().Add(wait); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if cancelled = raCancelled(up); len(cancelled) >= calls {
			break
		}
	}
	if len(cancelled) < calls {
		t.Errorf("%d calls of wait whose streams the runner dropped are past their 2s timeout, and the upstream was told to cancel %d of them (%v; %d of the calls ended upstream): "+
			"they go on working, while the caller (max_streams_per_caller 2) holds no stream place", calls, len(cancelled), cancelled, len(up.cancelled))
	}
}

// Attack: a runner whose stream is resumed loses the progress of its call.
// deliver (modules/mcpproxy/mcpproxy.go) drops a progress notification on
// a request's stream unless its token is of a request in progress
// (MCPSession.Progressing), and the token is registered only while the
// runner's POST is open (ServeHTTP: ms.Requesting): once the runner's
// request ended (the stream dropped, or a resume stopped its relay), the
// resumed stream carries the answer but none of the progress the upstream
// reported for the call — a runner that resumes sees its call go from the
// first step straight to done. Fix: a kept stream keeps its call's
// progress token registered until it is forgotten (as it keeps its body's
// room), or deliver lets pass progress on the token of the stream's own
// call (call.Message.ProgressToken).
func TestResumeAttackResumedStreamLosesItsProgress(t *testing.T) {
	key, _, auth := acctUser("resume-progress")
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, AuthExtra: auth})
	m := acctRunner(t, g, key)
	lastID := droppedAfterProgress(t, m) // progress on token "p", 10 steps
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	status, body, err := raGet(ctx, m, lastID)
	if err != nil || status != http.StatusOK || !strings.Contains(body, `"text":"done"`) {
		t.Fatalf("resuming the dropped stream: %d %v %.500s", status, err, body)
	}
	steps := strings.Count(body, `"method":"notifications/progress"`)
	if steps == 0 {
		t.Errorf("the resumed stream carries the answer and none of the 9 progress notifications the upstream sent after the runner's last event: %.800s", body)
	}
}

// Attack: a runner loses the answer to its call when it resumes a stream
// that stalled mid-answer. The gateway was writing the answer into a
// connection the runner no longer reads (a stalled middlebox); the runner
// resumes from the last event it got whole. takeOver
// (modules/mcpproxy/resume.go) stops the relay and waits for it; the relay
// was blocked in the write, which completes when the middlebox drains the
// bytes into the void, so the relay marks the stream settled and forgets
// it; takeOver then finds it settled and the resume gets 400 "names no
// stream this MCP session can resume". The tool ran, its answer reached
// nobody, and the runner is told there is nothing to resume (before the
// change, the resume replayed the rest from the upstream, answer
// included). Fix: a resume that waited for a relay which then wrote the
// answer still gets it: keep the final message on the runner stream and
// replay it to the resume (or resume upstream as before), instead of
// errNothingToResume.
func TestResumeAttackAnswerWrittenWhileAResumeWaitsIsLost(t *testing.T) {
	key, _, auth := acctUser("resume-race")
	up := startUpstream(t)
	release := make(chan struct{})
	stopped := make(chan struct{}) // the gateway gave up the call's upstream stream
	big := strings.Repeat("a", 8<<20)
	var answer atomic.Value
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		switch {
		case r.Method == http.MethodGet && r.Header.Get("Last-Event-Id") == "race-1":
			// The upstream's event store replays what followed race-1.
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			a, _ := answer.Load().(string)
			fmt.Fprintf(w, "id: race-2\ndata: %s\n\n", a)
			return true
		case r.Method == http.MethodPost && strings.Contains(string(body), "resume-race"):
			var msg struct {
				ID json.RawMessage `json:"id"`
			}
			_ = json.Unmarshal(body, &msg)
			a := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"%s"}]}}`, msg.ID, big)
			answer.Store(a)
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			fmt.Fprint(w, "id: race-1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"working\"}}\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
				return true
			}
			fmt.Fprintf(w, "id: race-2\ndata: %s\n\n", a)
			w.(http.Flusher).Flush()
			<-r.Context().Done() // the stream stays open until the gateway lets go of it
			close(stopped)
			return true
		}
		return false
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "30s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	stalled := *m
	stalled.transport = raSmallReads()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r0, err := stalled.send(ctx, http.MethodPost, "application/json, text/event-stream",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"resume-race"}}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	defer r0.Body.Close()
	if r0.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(r0.Body)
		t.Fatalf("the call: %d %.300s", r0.StatusCode, b)
	}
	text := raRead(t, r0.Body, "the first event", func(s string) bool { return strings.Contains(s, "working") && raHasID(s) })
	lastID := raLastID(text)
	close(release)
	// The answer starts to arrive; then the connection stalls (the runner
	// reads no more of it): the gateway is writing the answer.
	raRead(t, r0.Body, "the answer's beginning", func(s string) bool { return strings.Contains(s, `"result"`) })

	// The runner gives up on the stalled stream and resumes it.
	type result struct {
		status int
		body   string
		err    error
	}
	resumed := make(chan result, 1)
	go func() {
		status, body, err := raGet(ctx, m, lastID)
		resumed <- result{status, body, err}
	}()
	select {
	case <-stopped: // the resume stopped the relay (which is still writing)
	case <-time.After(15 * time.Second):
		t.Fatal("the resume never stopped the relay writing the stalled stream")
	}
	// The middlebox drains the stalled connection into the void.
	go func() { _, _ = io.Copy(io.Discard, r0.Body) }()
	var res result
	select {
	case res = <-resumed:
	case <-time.After(20 * time.Second):
		t.Fatal("the resume got no answer in 20s")
	}
	if res.err != nil || res.status != http.StatusOK || !strings.Contains(res.body, `"result"`) || !strings.Contains(res.body, "aaaaaaaa") {
		t.Errorf("the resume of a stream that stalled mid-answer: %d %v %.300s; want the answer (replayed by the upstream): it reached nobody", res.status, res.err, res.body)
	}
	r0.Body.Close()
	gaugesBackWithin(t, g, before, 5*time.Second)
}

// Attack: a resume sent just before the call's deadline silences the
// timeout: the runner's stream ends without an error and the upstream is
// never told to cancel the call. takeOver counts the resume
// (s.takeovers++) before it knows it will get the stream; the relay it
// stopped — here blocked writing to a runner that had stopped reading —
// ends quietly on seeing the count change (relay: "the runner resumed the
// stream on another request"), though the resume failed (its wait ended at
// the deadline: 503 "the stream is still in use; retry", for a stream that
// can no longer be resumed), and the stream, past its deadline, is
// forgotten. Without the resume, the same relay writes "the upstream did
// not answer in time" and sends notifications/cancelled. A runner can so
// keep any call running upstream past its timeout. Fix: a relay ends
// quietly only for a resume that got the stream (count the takeovers that
// succeeded, or check st.resumable() before ending quietly); otherwise it
// ends as it would have.
func TestResumeAttackResumeAtTheDeadlineSilencesTheTimeout(t *testing.T) {
	key, _, auth := acctUser("resume-deadline")
	up := startUpstream(t)
	written := floodingUpstream(up, "resume-deadline", "dl", 160, 256<<10)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "5s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	stalled := *m
	stalled.transport = raSmallReads()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	r0, err := stalled.send(ctx, http.MethodPost, "application/json, text/event-stream",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"resume-deadline"}}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	defer r0.Body.Close()
	if r0.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(r0.Body)
		t.Fatalf("the call: %d %.300s", r0.StatusCode, b)
	}
	lastID := raLastID(raRead(t, r0.Body, "the first event", func(s string) bool { return strings.Contains(s, "first") && raHasID(s) }))
	// The runner stops reading: the relay blocks writing to it, and the
	// upstream's writes stop.
	last := awaitStalled(written, 700*time.Millisecond)
	if last >= 160 {
		t.Fatal("the gateway read all of the upstream's events while its runner did not read: the relay never blocked")
	}
	t.Logf("the relay blocked after the upstream wrote %d events", last)
	// A resume, before the deadline; it waits for the blocked relay until
	// the deadline passes.
	status, body, err := raGet(ctx, m, lastID)
	t.Logf("the resume: %d %v %.200s", status, err, body)
	// The runner reads its stream to the end.
	tail, _ := io.ReadAll(r0.Body)
	end := string(tail)
	if i := strings.LastIndex(end, "event: message"); i >= 0 {
		end = end[i:]
	}
	if !strings.Contains(end, `"error"`) {
		t.Errorf("the call ran past its 5s timeout and its stream ended without an error (last event %.300q): the runner is never told", end)
	}
	var cancelled []string
	for range 30 {
		if cancelled = raCancelled(up); len(cancelled) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(cancelled) == 0 {
		t.Errorf("the call timed out and the upstream was never told to cancel it: the resume at the deadline suppressed notifications/cancelled")
	}
	r0.Body.Close()
	gaugesBackWithin(t, g, before, 5*time.Second)
}

// Attack: ending an MCP session (DELETE) does not give back the room of
// the request bodies its dropped streams hold: the streams are unreachable
// (the session forgot them: mcpsession close sets streams to nil), and
// each holds its body's room until its call's deadline (runnerStream.room,
// given back only by runnerStream.forget from the deadline timer). The
// caller's next session is refused (503, max_request_bytes_in_flight_per_caller)
// for a request that fits its share, until those deadlines — with a
// timeout of minutes, for minutes. README: DELETE "ends the MCP session …;
// its streams stop". Fix: when an MCP session ends, forget its kept
// streams (give back their rooms, cancel their calls): e.g. each kept
// runnerStream registers context.AfterFunc(ms.Context(), s.forget).
func TestResumeAttackEndedSessionKeepsItsDroppedStreamsRoom(t *testing.T) {
	key, _, auth := acctUser("resume-ended")
	up := startUpstream(t)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if r.Method != http.MethodDelete {
			return false
		}
		// The upstream ends its session at once (the go-sdk waits for
		// the session's calls to end first).
		w.WriteHeader(http.StatusNoContent)
		return true
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "12s", AuthExtra: auth,
		Extra: "max_request_size 256KiB\nmax_request_bytes_in_flight_per_caller 512KiB"})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	pad := strings.Repeat("p", 200<<10)
	var last time.Time
	for i := 1; i <= 2; i++ {
		_, last = acctOpenUntil(t, m, raWaitCall(i, pad), "") // to its priming event
	}
	if mid := readBoundGauges(t, g); mid.bytes < before.bytes+400<<10 {
		t.Fatalf("two dropped streams of 200 KiB requests: %v (before: %v), want their room held", mid, before)
	}
	deleted := time.Now()
	if status := m.delete(); status != http.StatusNoContent {
		t.Fatalf("DELETE of the MCP session: %d", status)
	}
	now, back := settleBoundGauges(t, g, before, 2*time.Second)
	if !back {
		t.Errorf("the MCP session ended %v ago, nothing can resume its streams, and their bodies' room stays held: %v (before: %v)", time.Since(deleted).Round(time.Millisecond), now, before)
	}
	m2 := acctRunner(t, g, key)
	if status, body := acctStatus(t, m2, acctPing(1, 200<<10)); status != http.StatusOK {
		t.Errorf("a 200 KiB ping in the caller's new session (share 512 KiB, nothing of its own in flight): %d %.300s", status, body)
	}
	// Nothing is left for later tests.
	wait := time.Until(last.Add(12*time.Second)) + 3*time.Second
	if now, back := settleBoundGauges(t, g, before, wait); !back {
		t.Errorf("after the deadlines, the gauges stay at %v (before: %v)", now, before)
	}
}

// ---- holds -----------------------------------------------------------------

// Holds: another caller, and the owner's other MCP session, cannot stop a
// stream that is still being written by naming its event id: the resume
// is refused before it reaches the stream (takeOver never runs), the
// owner's relay goes on, and the owner gets every step and the answer on
// the stream it opened; nothing is resumed or cancelled upstream.
func TestResumeHoldsForeignIDsStopNoOpenStream(t *testing.T) {
	ownerKey, _, ownerAuth := acctUser("resume-owner")
	intruderKey, _, intruderAuth := acctUser("resume-intruder")
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, AuthExtra: ownerAuth + "\n" + intruderAuth})
	m := acctRunner(t, g, ownerKey)
	other := acctRunner(t, g, ownerKey)
	intruder := acctRunner(t, g, intruderKey)
	stolen := *intruder
	stolen.sessionID = m.sessionID
	before := readBoundGauges(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r0, err := m.send(ctx, http.MethodPost, "application/json, text/event-stream", raProgressCall(1, 40, ""), "")
	if err != nil {
		t.Fatal(err)
	}
	defer r0.Body.Close()
	text := raRead(t, r0.Body, "the first progress", func(s string) bool { return strings.Contains(s, `"progress":1`) && raHasID(s) })
	lastID := raLastID(text)
	for name, r := range map[string]*rawMCP{"the owner's other session": other, "another caller's session": intruder, "another caller with the owner's session id": &stolen} {
		status, body, err := raGet(ctx, r, lastID)
		if err != nil || status == http.StatusOK || strings.Contains(body, "step") {
			t.Errorf("%s resuming the owner's open stream %q: %d %v %.300s", name, lastID, status, err, body)
		}
	}
	rest, _ := io.ReadAll(r0.Body)
	all := text + string(rest)
	if !strings.Contains(all, `"text":"done"`) || strings.Count(all, `"method":"notifications/progress"`) != 40 {
		t.Errorf("the owner's stream, after the foreign resumes: %d progress notifications, answer %v; want 40 and the answer",
			strings.Count(all, `"method":"notifications/progress"`), strings.Contains(all, `"text":"done"`))
	}
	if n := raResumes(up); n != 0 {
		t.Errorf("the upstream got %d resumptions", n)
	}
	if c := raCancelled(up); len(c) != 0 {
		t.Errorf("the upstream was told to cancel %v", c)
	}
	gaugesBackWithin(t, g, before, 5*time.Second)
}

// Holds: a runner resuming one dropped stream over and over — eight
// resumes dropped in a row, then four at once — starves nothing and leaves
// nothing behind: exactly one resume gets the answer, the call is never
// cancelled upstream, and every place and the body's room come back.
func TestResumeHoldsResumeLoopLastOneWins(t *testing.T) {
	key, _, auth := acctUser("resume-loop")
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "15s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	lastID, _ := acctOpenUntil(t, m, raProgressCall(1, 100, strings.Repeat("p", 64<<10)), `"progress":1`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 8 {
		rctx, rcancel := context.WithCancel(ctx)
		resp, err := m.send(rctx, http.MethodGet, "text/event-stream", "", lastID)
		if err != nil || resp.StatusCode != http.StatusOK {
			rcancel()
			t.Fatalf("resume %d: %v %v", i, err, resp)
		}
		time.Sleep(20 * time.Millisecond)
		rcancel()
		resp.Body.Close()
	}
	var wg sync.WaitGroup
	var answers atomic.Int32
	for range 4 {
		wg.Go(func() {
			status, body, err := raGet(ctx, m, lastID)
			t.Logf("a concurrent resume: %d %v %.200s", status, err, body)
			if strings.Contains(body, `"text":"done"`) {
				answers.Add(1)
			}
		})
	}
	wg.Wait()
	if n := answers.Load(); n != 1 {
		t.Errorf("%d of four concurrent resumes got the answer, want exactly one", n)
	}
	if c := raCancelled(up); len(c) != 0 {
		t.Errorf("the upstream was told to cancel %v", c)
	}
	gaugesBackWithin(t, g, before, 5*time.Second)
}

// Holds: an upstream that numbers events after its answer, and answers
// twice, gets nothing past its first answer to the runner, and nothing
// resumes the stream afterwards: a resume from any id the runner got —
// the answer's own included — is refused (400) without reaching the
// upstream.
func TestResumeHoldsNothingResumesAfterTheAnswer(t *testing.T) {
	key, _, auth := acctUser("resume-after")
	up := startUpstream(t)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if r.Method != http.MethodPost || !strings.Contains(string(body), "resume-after") {
			return false
		}
		var msg struct {
			ID json.RawMessage `json:"id"`
		}
		_ = json.Unmarshal(body, &msg)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		note := func(n int, what string) {
			fmt.Fprintf(w, "id: aft-%d\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":%q}}\n\n", n, what)
		}
		note(1, "before")
		fmt.Fprintf(w, "id: aft-2\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"first answer\"}]}}\n\n", msg.ID)
		note(3, "after the answer")
		fmt.Fprintf(w, "id: aft-4\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"second answer\"}]}}\n\n", msg.ID)
		note(5, "after the second answer")
		return true
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	resp, err := m.send(context.Background(), http.MethodPost, "application/json, text/event-stream",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"resume-after"}}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(b)
	if !strings.Contains(body, "first answer") || strings.Contains(body, "after the answer") || strings.Contains(body, "second answer") {
		t.Errorf("the runner's stream: %.800s; want the first answer and nothing after it", body)
	}
	var ids []string
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, "id: "); ok {
			ids = append(ids, v)
		}
	}
	if len(ids) == 0 {
		t.Fatalf("no event ids on %q", body)
	}
	for _, id := range ids {
		status, rb, err := raGet(context.Background(), m, id)
		if err != nil || status != http.StatusBadRequest {
			t.Errorf("resuming from %q after the answer: %d %v %.300s, want 400", id, status, err, rb)
		}
	}
	if n := raResumes(up); n != 0 {
		t.Errorf("the upstream got %d resumptions after the answer", n)
	}
	gaugesBackWithin(t, g, before, 5*time.Second)
}

// Holds: a federated runner that goes away mid-call gets its service's
// call cancelled. The federated stream cannot be resumed (it carries no
// event ids), and the sub-call keeps no stream for resumption
// (gateway.IsInnerRequest): its relay tells the upstream with
// notifications/cancelled, where a kept sub-call stream left the call
// running, and holds nothing afterwards.
func TestResumeHoldsFederatedRunnerLeavingCancelsTheCall(t *testing.T) {
	key, _, auth := acctUser("resume-federated")
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Federation: " ", Timeout: "20s", AuthExtra: auth})
	m := faRunner(t, g, key, `{}`)
	m.transport = &http.Transport{DisableKeepAlives: true}
	before := readBoundGauges(t, g)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		resp, err := m.send(ctx, http.MethodPost, "application/json, text/event-stream",
			`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"svc__wait","arguments":{}}}`, "")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	// The call reaches the upstream, then the runner goes away.
	for range 100 {
		n := 0
		for _, r := range up.requestLog() {
			if strings.Contains(r.Body, `"name":"wait"`) {
				n++
			}
		}
		if n > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	cancel()
	var cancelled []string
	for range 100 {
		if cancelled = raCancelled(up); len(cancelled) > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(cancelled) == 0 {
		t.Errorf("the federated runner went away mid-call and the service's call was never cancelled")
	}
	gaugesBackWithin(t, g, before, 5*time.Second)
}

// Holds: request bodies whose Content-Length lies. One declaring 0 with a
// message after it: the empty body is refused (400) and the bytes after it
// are no message of the MCP session; nothing reaches the upstream. One
// declaring more than it sends, held open: the room for the declared
// length is held while it is read (counted, as the gauge shows), and comes
// back when the runner closes the connection, nothing having reached the
// upstream.
func TestResumeHoldsContentLengthLies(t *testing.T) {
	key, _, auth := acctUser("resume-length")
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	sentBefore := len(up.requestLog())
	addr := strings.TrimPrefix(g.URL, "http://")
	head := func(length int) string {
		var sb strings.Builder
		fmt.Fprintf(&sb, "POST /v1/mcp/svc HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n", addr)
		for k, v := range m.headers {
			fmt.Fprintf(&sb, "%s: %s\r\n", k, v)
		}
		fmt.Fprintf(&sb, "Mcp-Session-Id: %s\r\nMcp-Protocol-Version: 2025-11-25\r\nContent-Length: %d\r\n\r\n", m.sessionID, length)
		return sb.String()
	}
	msg := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo","arguments":{"text":"smuggled"}}}`

	// Content-Length: 0, then a message.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, head(0)+msg); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("a body declaring 0 bytes followed by a message: %v", err)
	}
	answer, _ := io.ReadAll(resp.Body)
	c.Close()
	if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(answer), "smuggled") {
		t.Errorf("a body declaring 0 bytes followed by a message: %d %.500s, want 400 and nothing of the message", resp.StatusCode, answer)
	}

	// Content-Length larger than the body, held open, then closed.
	const declared = 100000
	c, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, head(declared)+msg[:40]); err != nil {
		t.Fatal(err)
	}
	held := false
	for range 50 {
		if now := readBoundGauges(t, g); now.bytes >= before.bytes+declared {
			held = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !held {
		t.Errorf("while a body declaring %d bytes is read, the gauge shows %v (before: %v), want its room held", declared, readBoundGauges(t, g), before)
	}
	c.Close()
	if now, back := settleBoundGauges(t, g, before, 5*time.Second); !back {
		t.Errorf("after the lying runners left, the gauges stay at %v (before: %v)", now, before)
	}
	for _, r := range up.requestLog()[sentBefore:] {
		if strings.Contains(r.Body, "smuggled") {
			t.Errorf("a message of a lying body reached the upstream: %.300s", r.Body)
		}
	}
}

// Holds: a stream dropped before a configuration reload is resumed after
// it, on the new configuration, to its answer; nothing is left held.
func TestResumeHoldsResumeAcrossAReload(t *testing.T) {
	key, _, auth := acctUser("resume-reload")
	up := startUpstream(t)
	cfg := gatewayConfig{Upstream: up.URL, Timeout: "15s", AuthExtra: auth, DataDir: t.TempDir()}
	port := freePort(t)
	g := startGatewayOnPort(t, port, cfg)
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	lastID, _ := acctOpenUntil(t, m, raProgressCall(1, 60, strings.Repeat("p", 32<<10)), `"progress":1`)
	g2 := startGatewayOnPort(t, port, cfg)
	m2 := *m
	m2.transport = &http.Transport{DisableKeepAlives: true}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	status, body, err := raGet(ctx, &m2, lastID)
	if err != nil || status != http.StatusOK || !strings.Contains(body, `"text":"done"`) {
		t.Errorf("resuming after the reload: %d %v %.500s, want the rest and the answer", status, err, body)
	}
	if now, back := settleBoundGauges(t, g2, before, 5*time.Second); !back {
		t.Errorf("at the end, the gauges stay at %v (before: %v)", now, before)
	}
}
