package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/sseref"
)

// The relay's streams against go-sdk upstreams, some of them made to
// misbehave or attack: resumption, cancellation, SSE read and written as
// the standard says, answers of every HTTP status through the same
// filters, server→client requests.

// A stream the upstream closes again and again while its tool
// works (SEP-1699 polling) is resumed for as long as events arrive.
func TestPollingStreamIsResumedWhileEventsArrive(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{})
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"poll","arguments":{"times":10}}}`)
	if !strings.Contains(string(lastMessage(t, msgs)), "polled 10 times") {
		t.Fatalf("answer = %s, want the tool's result", lastMessage(t, msgs))
	}
	resumes := 0
	for _, r := range up.requestLog() {
		if r.Method == http.MethodGet && r.Header.Get("Last-Event-Id") != "" {
			resumes++
		}
	}
	if resumes <= 5 { // (a close while toolgate reconnects closes nothing)
		t.Errorf("toolgate resumed %d times, want more than five", resumes)
	}
}

// Resumptions that bring nothing end after resume_attempts.
func TestResumptionWithoutProgressGivesUp(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{ServiceExtra: "resume_attempts 3"})
	var empty atomic.Int32
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if r.Method != http.MethodGet || r.Header.Get("Last-Event-Id") == "" {
			return false
		}
		empty.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK) // and nothing: the stream ends at once
		return true
	})
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"reconnect","arguments":{}}}`)
	if code, _ := rpcError(t, lastMessage(t, msgs)); code != -32011 {
		t.Fatalf("answer = %s, want a retryable error", lastMessage(t, msgs))
	}
	if n := empty.Load(); n != 3 {
		t.Errorf("toolgate resumed %d times without progress, want resume_attempts = 3", n)
	}
}

// A call whose deadline passes before the upstream's response
// headers (an upstream answering plain JSON) is cancelled upstream.
func TestDeadlineBeforeHeadersCancelsUpstream(t *testing.T) {
	up := startUpstreamWith(t, func(o *mcp.StreamableHTTPOptions) { o.JSONResponse = true })
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "500ms"})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"wait","arguments":{}}}`)
	if code, _ := rpcError(t, lastMessage(t, msgs)); code != -32011 {
		t.Fatalf("answer = %s, want a retryable error", lastMessage(t, msgs))
	}
	select {
	case name := <-up.cancelled:
		if name != "wait" {
			t.Errorf("cancelled %q", name)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream's tool was never cancelled")
	}
	var cancels int
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, `"method":"notifications/cancelled"`) && strings.Contains(r.Body, `"requestId":9`) {
			cancels++
		}
	}
	if cancels != 1 {
		t.Errorf("the upstream received %d notifications/cancelled for the call, want 1", cancels)
	}
}

// sseRewriter rewrites what an upstream writes, to make it send SSE that is
// valid but unusual (or malicious).
type sseRewriter struct {
	http.ResponseWriter
	rewrite func([]byte) []byte
}

func (s *sseRewriter) Write(b []byte) (int, error) {
	if _, err := s.ResponseWriter.Write(s.rewrite(b)); err != nil {
		return 0, err
	}
	return len(b), nil
}

func (s *sseRewriter) Flush() { http.NewResponseController(s.ResponseWriter).Flush() }

// An upstream stream with bare-CR line ends and a leading byte
// order mark reads as any standard client reads it.
func TestUpstreamSSEWithBareCRAndBOM(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{})
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if !strings.Contains(string(body), "CR-LINES") {
			return false
		}
		first := true
		rw := &sseRewriter{ResponseWriter: w, rewrite: func(b []byte) []byte {
			out := []byte(strings.ReplaceAll(string(b), "\n", "\r"))
			if first {
				first = false
				out = append([]byte("\uFEFF"), out...)
			}
			return out
		}}
		up.mcpHandler().ServeHTTP(rw, r)
		return true
	})
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"CR-LINES"}}}`)
	if !strings.Contains(string(lastMessage(t, msgs)), `CR-LINES`) {
		t.Fatalf("answer = %s, want the echo", lastMessage(t, msgs))
	}
}

// An empty id field resets the last event id, so toolgate does
// not resume a stream from a stale one.
func TestEmptyEventIDResetsTheLastEventID(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{})
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if !strings.Contains(string(body), "RESET-ID") {
			return false
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "id: stale_1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"a\"}}\n\n"+
			"id:\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"b\"}}\n\n")
		return true // and the stream ends without an answer
	})
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"echo","arguments":{"text":"RESET-ID"}}}`)
	if code, _ := rpcError(t, lastMessage(t, msgs)); code != -32011 {
		t.Fatalf("answer = %s, want a retryable error", lastMessage(t, msgs))
	}
	for _, r := range up.requestLog() {
		if id := r.Header.Get("Last-Event-Id"); id != "" {
			t.Errorf("toolgate resumed with Last-Event-ID %q after the upstream reset it", id)
		}
	}
}

// A server→client request on the stream of a runner whose
// request does not accept SSE is answered with an error at once, instead
// of leaving the upstream waiting.
func TestServerRequestForAJSONOnlyRunnerIsRefused(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "5s"})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	status, hdr, _ := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{}},"clientInfo":{"name":"raw","version":"1"}}}`)
	if status != http.StatusOK {
		t.Fatalf("initialize: %d", status)
	}
	m.sessionID = hdr.Get("Mcp-Session-Id")
	m.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	resp, err := m.send(context.Background(), http.MethodPost, "application/json",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ask","arguments":{}}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "elicitation failed") {
		t.Fatalf("answer = %s, want the tool to learn at once that the client cannot be asked", body)
	}
}

// Streams toolgate writes carry event ids (and a priming event),
// and a silent stream carries keep-alive comments.
func TestRunnerStreamsHaveEventIDsAndKeepAlives(t *testing.T) {
	_, _, m := aliceSession(t, gatewayConfig{ServiceExtra: "sse_keepalive 50ms"})
	resp, err := m.send(context.Background(), http.MethodPost, "application/json, text/event-stream",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"poll","arguments":{"times":4},"_meta":{"progressToken":"p"}}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	stream := sseref.Parse(string(body))
	if len(stream.Events) == 0 || stream.Events[0].Data != "" || stream.Events[0].LastEventID == "" {
		t.Errorf("the stream does not start with a priming event: %q", body)
	}
	last := stream.Events[len(stream.Events)-1]
	if !strings.Contains(last.Data, "polled 4 times") || last.LastEventID == "" {
		t.Errorf("the answer event = %+v, want it with an event id", last)
	}
	if !strings.Contains(string(body), "\n: keep-alive\n") {
		t.Errorf("no keep-alive comment on a stream silent for 120ms at a time: %q", body)
	}
}

// A runner whose stream drops resumes it with GET and
// Last-Event-ID, and gets the rest of it, answer included.
func TestRunnerResumesADroppedStream(t *testing.T) {
	_, _, m := aliceSession(t, gatewayConfig{})
	lastID := droppedAfterProgress(t, m)
	// Only ids toolgate gave out resume anything.
	token, _, _ := strings.Cut(lastID, ".")
	for _, forged := range []string{token + ".999", "someone-else.1", "a_0"} {
		resp, err := m.send(context.Background(), http.MethodGet, "text/event-stream", "", forged)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET with Last-Event-ID %q: %d, want 400", forged, resp.StatusCode)
		}
	}
	resumed, err := m.send(context.Background(), http.MethodGet, "text/event-stream", "", lastID)
	if err != nil || resumed.StatusCode != http.StatusOK {
		t.Fatalf("GET with Last-Event-ID %q: %v %v", lastID, err, resumed)
	}
	body, _ := io.ReadAll(resumed.Body)
	resumed.Body.Close()
	stream := sseref.Parse(string(body))
	if len(stream.Events) == 0 || !strings.Contains(stream.Events[len(stream.Events)-1].Data, `"text":"done"`) {
		t.Fatalf("the resumed stream = %q, want the rest and the answer", body)
	}
	if strings.Contains(string(body), `"progress":1,`) {
		t.Errorf("the resumed stream repeats what the runner had: %q", body)
	}
}

// A runner that resumes its stream while its first request is still open
// (a client that gave up on a stalled connection without closing it) gets
// the rest of the call on the resumed stream: the first relay stops
// quietly, and the upstream is not told to cancel the call.
func TestRunnerResumesAStreamStillOpen(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, err := m.send(ctx, http.MethodPost, "application/json, text/event-stream",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"progress","arguments":{"steps":40},"_meta":{"progressToken":"p"}}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	lines := bufio.NewReader(first.Body)
	lastID := ""
	for !strings.Contains(lastID, ".") {
		line, err := lines.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended before any event with an id: %v", err)
		}
		if id, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "id: "); ok && strings.Contains(line, ".") {
			lastID = id
		}
	}
	resumed, err := m.send(context.Background(), http.MethodGet, "text/event-stream", "", lastID)
	if err != nil || resumed.StatusCode != http.StatusOK {
		t.Fatalf("GET with Last-Event-ID %q while the first request is open: %v %v", lastID, err, resumed)
	}
	body, _ := io.ReadAll(resumed.Body)
	resumed.Body.Close()
	stream := sseref.Parse(string(body))
	if len(stream.Events) == 0 || !strings.Contains(stream.Events[len(stream.Events)-1].Data, `"text":"done"`) {
		t.Fatalf("the resumed stream = %q, want the rest and the answer", body)
	}
	rest, _ := io.ReadAll(lines)
	if strings.Contains(string(rest), `"error"`) {
		t.Errorf("the first stream, taken over, ended with an error: %q", rest)
	}
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, "notifications/cancelled") {
			t.Errorf("the upstream was told to cancel the call: %s", r.Body)
		}
	}
}

// A bare CR in an upstream's SSE data cannot show the result
// policy one message and a standard-conforming runner another.
func TestBareCRCannotHideAResultFromThePolicy(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{})
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if !strings.Contains(string(body), "CR-ATTACK") {
			return false
		}
		// Read with LF line ends only, the data is a result whose text is
		// "ok"; read as the standard says, the text is the secret.
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message\n"+
			"data: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\r\"ok\",\"x\":{\n"+
			"data: \"the password is SECRET-VALUE\"\r:1}\n"+
			"data: }]}}\n\n")
		return true
	})
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"CR-ATTACK"}}}`)
	answer := string(lastMessage(t, msgs))
	if strings.Contains(answer, "SECRET-VALUE") || !strings.Contains(answer, "[REDACTED]") {
		t.Fatalf("a conforming runner read %s; the result policy must have seen (and redacted) the same text", answer)
	}
}

// An upstream's 4xx answer passes the same strict reading and
// the same filters as a 2xx one, or is replaced by toolgate's own error.
func TestUpstreamErrorBodiesPassTheSameFilters(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{})
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		var answer string
		switch {
		case strings.Contains(string(body), `"id":77`):
			answer = `{"jsonrpc":"2.0","id":77,"result":{"tools":[{"name":"not_allowlisted","inputSchema":{"type":"object"}},{"name":"echo","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}]}}`
		case strings.Contains(string(body), `"id":78`):
			answer = `{"jsonrpc":"2.0","id":78,"error":{"code":-1,"message":"bad","message":"SECRET"}}`
		case strings.Contains(string(body), `"id":79`):
			answer = `{"error":"not a JSON-RPC message"}`
		default:
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, answer)
		return true
	})
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":77,"method":"tools/list"}`)
	if list := string(lastMessage(t, msgs)); strings.Contains(list, "not_allowlisted") || !strings.Contains(list, `"echo"`) {
		t.Errorf("tools/list answered with HTTP 400 = %s, want the allowlist applied", list)
	}
	for _, id := range []string{"78", "79"} {
		_, _, msgs = m.post(`{"jsonrpc":"2.0","id":` + id + `,"method":"prompts/list"}`)
		answer := string(lastMessage(t, msgs))
		if strings.Contains(answer, "SECRET") || strings.Contains(answer, "not a JSON-RPC") || !strings.Contains(answer, "HTTP 400") {
			t.Errorf("id %s: answer = %s, want toolgate's own error", id, answer)
		}
	}
}

// The runner's answer to a server→client request is matched on
// the id's value however it is spelled, so the policy judges it as the
// answer to that request; an answer to nothing pending is refused.
func TestRespelledServerRequestIDIsAttributed(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initializeWith(`{"elicitation":{}}`)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if !strings.Contains(string(body), "ASK-E1") {
			return false
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"e1\",\"method\":\"elicitation/create\",\"params\":{\"message\":\"ok?\",\"requestedSchema\":{\"type\":\"object\"}}}\n\n")
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
		return true
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := m.send(ctx, http.MethodPost, "application/json, text/event-stream",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"ASK-E1"}}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() && !strings.Contains(lines.Text(), "elicitation/create") {
	}
	asked := gjson.Get(strings.TrimPrefix(lines.Text(), "data: "), "id").String()
	if !strings.HasPrefix(asked, "toolgate-request:") {
		t.Fatalf("the runner was asked under %q", asked)
	}
	// The policy denies answers to elicitation/create: the upstream gets
	// toolgate's error in the answer's place, under its own id, never the
	// answer.
	respelled := `"\u0074` + asked[1:] + `"`
	status, _, msgs := m.post(`{"jsonrpc":"2.0","id":` + respelled + `,"result":{"action":"accept","content":{}}}`)
	if status != http.StatusAccepted {
		t.Errorf("a re-spelled answer to elicitation/create: %d %s, want 202 (stood in for by an error)", status, msgs)
	}
	stoodIn := false
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, `"action":"accept"`) {
			t.Errorf("the denied answer reached the upstream: %s", r.Body)
		}
		stoodIn = stoodIn || (strings.Contains(r.Body, `"id":"e1"`) && strings.Contains(r.Body, "withheld by toolgate's policy"))
	}
	if !stoodIn {
		t.Error("the upstream did not get toolgate's error in place of the denied answer (the re-spelled id was not attributed to elicitation/create)")
	}
	if status, _, msgs := m.post(`{"jsonrpc":"2.0","id":"nothing-pending","result":{}}`); status != http.StatusBadRequest {
		t.Errorf("an answer to no pending request: %d %s, want 400", status, msgs)
	}
}

// A runner's answer to a server→client request that the policy denies
// never reaches the upstream: the upstream gets an error answer in its
// place at once, instead of waiting until its timeout for an answer that
// never comes, and the tool says why.
func TestDeniedAnswerReachesTheUpstreamAsAnError(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "60s"})
	answered := make(chan struct{}, 1)
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			answered <- struct{}{}
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"ok": true}}, nil
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{}})
	if err != nil {
		t.Fatalf("the call whose elicitation answer was denied: %v (the upstream was left waiting)", err)
	}
	text := callText(t, res)
	if !strings.HasPrefix(text, "elicitation failed: ") || !strings.Contains(text, "withheld by toolgate's policy") {
		t.Fatalf("the tool learned %q, want that the client's answer was withheld", text)
	}
	select {
	case <-answered:
	default:
		t.Fatal("the runner was never asked")
	}
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, `"action":"accept"`) {
			t.Fatalf("the denied answer reached the upstream: %s", r.Body)
		}
	}
}

// A policy that asks for an approval of a runner's answer cannot have it
// (an answer cannot wait): the answer is withheld as if denied, and the
// upstream gets toolgate's error in its place at once.
func TestAskedAnswerReachesTheUpstreamAsAnError(t *testing.T) {
	dir := t.TempDir()
	rego := "package toolgate.request\n\ndefault decision := {\"action\": \"allow\"}\n\n" +
		"decision := {\"action\": \"ask\", \"reason\": \"answers need a look\"} if {\n\tinput.method == \"elicitation/create\"\n}\n"
	for name, text := range map[string]string{"request.rego": rego, "result.rego": allowResults} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: dir, Timeout: "60s"})
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"ok": true}}, nil
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{}})
	if err != nil {
		t.Fatalf("the call whose elicitation answer the policy asked about: %v (the upstream was left waiting)", err)
	}
	if text := callText(t, res); !strings.Contains(text, "withheld by toolgate's policy") {
		t.Fatalf("the tool learned %q, want that the client's answer was withheld", text)
	}
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, `"action":"accept"`) {
			t.Fatalf("the answer reached the upstream: %s", r.Body)
		}
	}
}

// droppedAfterProgress calls the upstream's progress tool on m's session,
// reads its stream up to the first progress notification, drops it, and
// returns the id of the last event read (for Last-Event-ID).
func droppedAfterProgress(t *testing.T, m *rawMCP) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := m.send(ctx, http.MethodPost, "application/json, text/event-stream",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"progress","arguments":{"steps":10},"_meta":{"progressToken":"p"}}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewReader(resp.Body)
	lastID := ""
	for {
		line, err := lines.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended before any progress: %v", err)
		}
		if id, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "id: "); ok {
			lastID = id
		}
		if strings.Contains(line, `"progress":1`) {
			break
		}
	}
	if lastID == "" {
		t.Fatal("the progress event had no id")
	}
	return lastID
}
