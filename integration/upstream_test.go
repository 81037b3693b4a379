package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
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
// (so it answers 404, as a restarted server does).
type upstream struct {
	URL string

	mu       sync.Mutex
	handler  http.Handler
	received []http.Header
	server   *httptest.Server
}

// unknownFieldMarker makes the upstream add a field no MCP version defines
// to a tool result, like a newer server would.
const unknownFieldMarker = "ADD-UNKNOWN-FIELD"

// duplicateKeyMarker makes the upstream send a result whose text key
// appears twice, the second time with a secret.
const duplicateKeyMarker = "ADD-DUPLICATE-KEY"

func startUpstream(t testing.TB) *upstream {
	t.Helper()
	u := &upstream{}
	u.reset()
	u.server = httptest.NewServer(http.HandlerFunc(u.serve))
	u.URL = u.server.URL + "/mcp"
	t.Cleanup(u.server.Close)
	return u
}

// reset replaces the MCP handler: every existing session is forgotten.
func (u *upstream) reset() {
	server := newTestServer()
	// The event store lets clients resume a dropped stream with
	// Last-Event-ID (the reconnect tool drops its stream on purpose).
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{SessionTimeout: time.Minute, EventStore: mcp.NewMemoryEventStore(nil)})
	u.mu.Lock()
	u.handler = h
	u.mu.Unlock()
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.received = append(u.received, r.Header.Clone())
	h := u.handler
	u.mu.Unlock()
	h.ServeHTTP(&fieldAdder{ResponseWriter: w}, r)
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

// newTestServer builds the upstream's MCP server and its tools.
func newTestServer() *mcp.Server {
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
	mcp.AddTool(s, &mcp.Tool{Name: "pinned_echo", Description: "Echo; the policy pins project.", Annotations: readOnly}, echo)
	mcp.AddTool(s, &mcp.Tool{Name: "forbidden_tool", Description: "Denied by the test policy.", Annotations: readOnly}, echo)
	mcp.AddTool(s, &mcp.Tool{Name: "gated_tool", Description: "Needs approval by the test policy."}, echo)
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
