package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func sha256Sum(b []byte) [32]byte { return sha256.Sum256(b) }

// sha256Hex is how storage keys name a user: the hex SHA-256.
func sha256Hex(s string) string { return fmt.Sprintf("%x", sha256.Sum256([]byte(s))) }

// upstream is a real MCP server built with the official Go SDK, behind a
// middleware that records what it received and can forget every session
// (so it answers 404, as a restarted server does). A test may intercept
// requests to make the upstream misbehave (slow, broken, malicious).
type upstream struct {
	URL string

	mu        sync.Mutex
	handler   http.Handler
	received  []http.Header
	requests  []upstreamRequest
	intercept func(w http.ResponseWriter, r *http.Request, body []byte) bool
	options   mcp.StreamableHTTPOptions
	server    *httptest.Server
	build     func(*upstream) *mcp.Server // the MCP server; newTestServer when nil

	// cancelled receives the id of each wait call the upstream saw
	// cancelled (notifications/cancelled).
	cancelled chan string
	// laterDone receives the end of what a malicious upstream's "later"
	// tool does on the standalone stream (channels_test.go).
	laterDone chan error
	// conns counts the open TCP connections to the upstream.
	conns map[net.Conn]http.ConnState
	// accepted counts the TCP connections the upstream ever accepted.
	accepted int
	// slowRan counts the runs of slow_echo by text.
	slowRan map[string]int
}

// upstreamRequest is one HTTP request the upstream received.
type upstreamRequest struct {
	Method    string
	Header    http.Header
	Body      string
	SessionID string // the Mcp-Session-Id the upstream answered with, for an initialize
}

// unknownFieldMarker makes the upstream add a field no MCP version defines
// to a tool result, like a newer server would.
const unknownFieldMarker = "ADD-UNKNOWN-FIELD"

// duplicateKeyMarker makes the upstream send a result whose text key
// appears twice, the second time with a secret.
const duplicateKeyMarker = "ADD-DUPLICATE-KEY"

func startUpstream(t testing.TB) *upstream {
	return startUpstreamWith(t, nil)
}

// startUpstreamWith starts an upstream whose transport options configure
// changes, such as JSONResponse.
func startUpstreamWith(t testing.TB, configure func(*mcp.StreamableHTTPOptions)) *upstream {
	t.Helper()
	return startUpstreamServer(t, configure, nil)
}

// startUpstreamServer starts an upstream serving the MCP server build
// makes (newTestServer when nil), with transport options configure
// changes.
func startUpstreamServer(t testing.TB, configure func(*mcp.StreamableHTTPOptions), build func(*upstream) *mcp.Server) *upstream {
	t.Helper()
	// The event store lets clients resume a dropped stream with
	// Last-Event-ID (the reconnect tool drops its stream on purpose).
	u := &upstream{cancelled: make(chan string, 16), laterDone: make(chan error, 1), conns: make(map[net.Conn]http.ConnState),
		options: mcp.StreamableHTTPOptions{SessionTimeout: time.Minute, EventStore: mcp.NewMemoryEventStore(nil)}}
	if configure != nil {
		configure(&u.options)
	}
	u.build = build
	if u.build == nil {
		u.build = newTestServer
	}
	u.reset()
	u.server = httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	u.server.Config.ConnState = func(c net.Conn, state http.ConnState) {
		u.mu.Lock()
		defer u.mu.Unlock()
		if state == http.StateNew {
			u.accepted++
		}
		if state == http.StateClosed || state == http.StateHijacked {
			delete(u.conns, c)
		} else {
			u.conns[c] = state
		}
	}
	u.server.Start()
	u.URL = u.server.URL + "/mcp"
	t.Cleanup(u.server.Close)
	return u
}

// reset replaces the MCP handler: every existing session is forgotten.
func (u *upstream) reset() {
	server := u.build(u)
	opts := u.options
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &opts)
	u.mu.Lock()
	u.handler = h
	u.mu.Unlock()
}

// mcpHandler is the go-sdk handler serving now.
func (u *upstream) mcpHandler() http.Handler {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.handler
}

// setIntercept makes f see every request first; it handles those it
// returns true for.
func (u *upstream) setIntercept(f func(w http.ResponseWriter, r *http.Request, body []byte) bool) {
	u.mu.Lock()
	u.intercept = f
	u.mu.Unlock()
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	u.mu.Lock()
	u.received = append(u.received, r.Header.Clone())
	recorded := body
	if len(recorded) > 4096 {
		recorded = recorded[:4096]
	}
	u.requests = append(u.requests, upstreamRequest{Method: r.Method, Header: r.Header.Clone(), Body: string(recorded)})
	i := len(u.requests) - 1
	h, intercept := u.handler, u.intercept
	u.mu.Unlock()
	if intercept != nil && intercept(w, r, body) {
		return
	}
	h.ServeHTTP(&fieldAdder{ResponseWriter: w}, r)
	if strings.Contains(string(body), `"method":"initialize"`) {
		u.mu.Lock()
		u.requests[i].SessionID = w.Header().Get("Mcp-Session-Id")
		u.mu.Unlock()
	}
}

// slowRuns returns how often slow_echo ran, by text.
func (u *upstream) slowRuns() map[string]int {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make(map[string]int, len(u.slowRan))
	for k, v := range u.slowRan {
		out[k] = v
	}
	return out
}

// requestLog returns every request received so far.
func (u *upstream) requestLog() []upstreamRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]upstreamRequest(nil), u.requests...)
}

// openSessions returns the upstream sessions initialized and not ended
// with DELETE.
func (u *upstream) openSessions() []string {
	open := map[string]bool{}
	for _, r := range u.requestLog() {
		if r.SessionID != "" {
			open[r.SessionID] = true
		}
		if r.Method == http.MethodDelete {
			delete(open, r.Header.Get("Mcp-Session-Id"))
		}
	}
	var ids []string
	for id := range open {
		ids = append(ids, id)
	}
	return ids
}

// openConns returns the number of open TCP connections to the upstream.
func (u *upstream) openConns() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.conns)
}

// acceptedConns returns the number of TCP connections the upstream
// accepted so far.
func (u *upstream) acceptedConns() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.accepted
}

// headers returns the headers of every request received so far.
func (u *upstream) headers() []http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]http.Header(nil), u.received...)
}

// fieldAdder rewrites the marker in response bytes into an unknown field.
type fieldAdder struct {
	http.ResponseWriter
}

func (f *fieldAdder) Write(b []byte) (int, error) {
	if i := bytes.Index(b, []byte(`"type":"text"`)); i >= 0 && bytes.Contains(b, []byte(duplicateKeyMarker)) {
		out := append(append(append([]byte{}, b[:i]...), `"text":"SECRET",`...), b[i:]...)
		if _, err := f.ResponseWriter.Write(out); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	if bytes.Contains(b, []byte(unknownFieldMarker)) {
		out := bytes.Replace(b, []byte(`"isError":false`), []byte(`"isError":false,"x_future_field":{"kept":[1,2,3]}`), 1)
		out = bytes.Replace(out, []byte(`"content":[`), []byte(`"x_future_field":{"kept":[1,2,3]},"content":[`), 1)
		if _, err := f.ResponseWriter.Write(out); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return f.ResponseWriter.Write(b)
}

func (f *fieldAdder) Flush() {
	if fl, ok := f.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}

type echoArgs struct {
	Text    string `json:"text,omitempty"`
	Project string `json:"project,omitempty"`
}

type progressArgs struct {
	Steps int `json:"steps"`
}

// newTestServer builds the upstream's MCP server and its tools; u, when
// set, learns what the tools observe.
func newTestServer(u *upstream) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "test-upstream", Version: "1.0.0"}, &mcp.ServerOptions{
		SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { return nil },
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
	})
	text := func(uri, body string) mcp.ResourceHandler {
		return func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "text/plain", Text: body}}}, nil
		}
	}
	s.AddResource(&mcp.Resource{Name: "watched", URI: "test://watched", MIMEType: "text/plain"}, text("test://watched", "watch me"))
	s.AddResource(&mcp.Resource{Name: "secret", URI: "test://secret", MIMEType: "text/plain"}, text("test://secret", "the test policy hides this"))
	mcp.AddTool(s, &mcp.Tool{Name: "touch_resource", Description: "Reports test://watched as updated.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			if err := s.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "test://watched"}); err != nil {
				return nil, nil, err
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "touched"}}}, nil, nil
		})
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true}
	echo := func(_ context.Context, req *mcp.CallToolRequest, in echoArgs) (*mcp.CallToolResult, any, error) {
		args, _ := json.Marshal(in)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(args)}}}, nil, nil
	}
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Echo the arguments.", Annotations: readOnly}, echo)
	mcp.AddTool(s, &mcp.Tool{Name: "slow_echo", Description: "Echo the text after ms milliseconds (at most 2000).", Annotations: readOnly},
		func(ctx context.Context, _ *mcp.CallToolRequest, in struct {
			Text string `json:"text"`
			MS   int    `json:"ms"`
		}) (*mcp.CallToolResult, any, error) {
			if u != nil {
				u.mu.Lock()
				if u.slowRan == nil {
					u.slowRan = map[string]int{}
				}
				u.slowRan[in.Text]++
				u.mu.Unlock()
			}
			select {
			case <-time.After(time.Duration(min(in.MS, 2000)) * time.Millisecond):
			case <-ctx.Done():
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "pinned_echo", Description: "Echo; the policy pins project.", Annotations: readOnly}, echo)
	mcp.AddTool(s, &mcp.Tool{Name: "forbidden_tool", Description: "Denied by the test policy.", Annotations: readOnly}, echo)
	mcp.AddTool(s, &mcp.Tool{Name: "gated_tool", Description: "Needs approval by the test policy.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false)}}, echo)
	mcp.AddTool(s, &mcp.Tool{Name: "unannotated", Description: "Says nothing about what it does."}, echo)
	// An upstream's annotations are its own claims: this one calls a
	// destructive tool read-only.
	mcp.AddTool(s, &mcp.Tool{Name: "delete_all_tickets", Description: "Deletes every ticket.", Annotations: readOnly}, echo)
	mcp.AddTool(s, &mcp.Tool{Name: "not_allowlisted", Description: "Exists upstream only.", Annotations: readOnly}, echo)
	mcp.AddTool(s, &mcp.Tool{Name: "redacted", Description: "Returns a secret the result policy removes.", Annotations: readOnly},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "the password is SECRET-VALUE"}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "unknown_field", Description: "Returns a result with a field from the future.", Annotations: readOnly},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: unknownFieldMarker}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "reconnect", Description: "Closes its SSE stream mid-call (SEP-1699), then answers.", Annotations: readOnly},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			token := req.Params.GetProgressToken()
			if token != nil {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: 1, Total: 2})
			}
			req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: 20 * time.Millisecond})
			time.Sleep(50 * time.Millisecond)
			if token != nil {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: 2, Total: 2})
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "answered after the stream was resumed"}}}, nil, nil
		})
	// set_visibility decodes its arguments with encoding/json, as many Go
	// servers do: it matches keys to fields ignoring case and folding
	// Unicode ("TICKET_ID" and "viſibility" fill TicketID and Visibility).
	s.AddTool(&mcp.Tool{Name: "set_visibility", Description: "Sets a ticket's visibility.", Annotations: readOnly,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"ticket_id":{"type":"string"},"visibility":{"type":"string"}}}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var in struct {
				TicketID   string `json:"ticket_id"`
				Visibility string `json:"visibility"`
			}
			if err := json.Unmarshal(req.Params.Arguments, &in); err != nil {
				return nil, err
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.TicketID + " is " + in.Visibility}}}, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "drop_table", Description: "Destructive.", Annotations: &mcp.ToolAnnotations{DestructiveHint: new(true)}}, echo)
	mcp.AddTool(s, &mcp.Tool{Name: "leak", Description: "Returns a secret-shaped string.", Annotations: readOnly},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "key AKIAIOSFODNN7EXAMPLE found"}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "big", Description: "Returns a text of the given size.", Annotations: readOnly},
		func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			Bytes int `json:"bytes"`
		}) (*mcp.CallToolResult, any, error) {
			line := "lorem ipsum dolor sit amet, consectetur adipiscing elit\n"
			text := strings.Repeat(line, in.Bytes/len(line)+1)[:in.Bytes]
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "poll", Description: "Closes its SSE stream the given number of times while it works (SEP-1699 polling), then answers.", Annotations: readOnly},
		func(ctx context.Context, req *mcp.CallToolRequest, in struct {
			Times int `json:"times"`
		}) (*mcp.CallToolResult, any, error) {
			for range in.Times {
				req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: 5 * time.Millisecond})
				time.Sleep(30 * time.Millisecond)
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("polled %d times", in.Times)}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "wait", Description: "Works until cancelled (at most 10s).", Annotations: readOnly},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			select {
			case <-ctx.Done():
				if u != nil {
					select {
					case u.cancelled <- req.Params.Name:
					default:
					}
				}
				return nil, nil, ctx.Err()
			case <-time.After(10 * time.Second):
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "waited"}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "ask", Description: "Asks the user (elicitation/create) and reports the answer.", Annotations: readOnly},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: "proceed?",
				RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"ok": map[string]any{"type": "boolean"}}}})
			text := ""
			if err != nil {
				text = "elicitation failed: " + err.Error()
			} else {
				text = "elicitation answered: " + res.Action
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "add_tool", Description: "Adds the tool late_tool (the server then sends notifications/tools/list_changed).", Annotations: readOnly},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			mcp.AddTool(s, &mcp.Tool{Name: "late_tool", Description: "Added while the session runs.", Annotations: readOnly}, echo)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "added"}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "progress", Description: "Reports progress, then answers.", Annotations: readOnly},
		func(ctx context.Context, req *mcp.CallToolRequest, in progressArgs) (*mcp.CallToolResult, any, error) {
			token := req.Params.GetProgressToken()
			for i := 1; i <= in.Steps; i++ {
				if token != nil {
					err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
						ProgressToken: token, Progress: float64(i), Total: float64(in.Steps), Message: fmt.Sprintf("step %d", i),
					})
					if err != nil {
						return nil, nil, err
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
		})
	return s
}

// headerValues collects every value of name across requests.
func headerValues(hs []http.Header, name string) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.Values(name)...)
	}
	return out
}

func containsAny(values []string, needles ...string) bool {
	for _, v := range values {
		for _, n := range needles {
			if n != "" && strings.Contains(v, n) {
				return true
			}
		}
	}
	return false
}
