// Package demo is toolgate_demo: a small fictional work tracker, served as
// an MCP server (built with the official MCP Go SDK) so the gateway has
// something to front out of the box. It is what caddyfile/demo.Caddyfile
// runs on a second local port. It is not meant for production.
//
// The tracker knows three tools: whoami and read_ticket (read-only) and
// delete_ticket (destructive; the demo registry does not allowlist it). It
// accepts personal bearer tokens of the form "demo-tracker-<name>", and
// reports <name> as the user.
package demo

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func init() {
	caddy.RegisterModule(Handler{})
	httpcaddyfile.RegisterHandlerDirective("toolgate_demo", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		m := new(Handler)
		err := m.UnmarshalCaddyfile(h.Dispenser)
		return m, err
	})
	httpcaddyfile.RegisterDirectiveOrder("toolgate_demo", httpcaddyfile.Before, "respond")
}

// Handler serves the demo tracker's MCP endpoint.
type Handler struct {
	mcp http.Handler
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.toolgate_demo",
		New: func() caddy.Module { return new(Handler) },
	}
}

// TokenPrefix starts every token the demo tracker accepts.
const TokenPrefix = "demo-tracker-"

// Provision builds the tracker.
func (h *Handler) Provision(caddy.Context) error {
	server := NewServer()
	h.mcp = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{SessionTimeout: 30 * time.Minute})
	return nil
}

// ServeHTTP checks the bearer token and serves MCP.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if userOf(r.Header) == "" {
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		http.Error(w, "the tracker wants a bearer token like "+TokenPrefix+"alice", http.StatusUnauthorized)
		return nil
	}
	h.mcp.ServeHTTP(w, r)
	return nil
}

// userOf returns the user a request's demo token names, or "".
func userOf(h http.Header) string {
	token, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
	if !ok {
		return ""
	}
	user, ok := strings.CutPrefix(token, TokenPrefix)
	if !ok {
		return ""
	}
	return user
}

type ticketArgs struct {
	TicketID string `json:"ticket_id" jsonschema:"the ticket id, such as TEST-123"`
}

// Ticket is one tracker ticket.
type Ticket struct {
	ID     string `json:"id"`
	Title  string `json:"title"`
	Status string `json:"status"`
	Body   string `json:"body"`
}

type whoamiResult struct {
	User string `json:"user"`
}

// NewServer returns the tracker's MCP server with a fresh set of tickets.
func NewServer() *mcp.Server {
	tickets := &ticketStore{tickets: map[string]Ticket{
		"TEST-123": {ID: "TEST-123", Title: "Login page returns 500", Status: "open",
			Body: "Since the last deploy, POST /login answers 500 for users with SSO enabled."},
		"TEST-124": {ID: "TEST-124", Title: "Add dark mode", Status: "in progress",
			Body: "Follow the design system's dark palette."},
	}}
	s := mcp.NewServer(&mcp.Implementation{Name: "demo-tracker", Title: "Demo work tracker", Version: "1.0.0"}, nil)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "whoami",
		Description: "Tell which tracker user the credential belongs to.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: new(false)},
	}, func(_ context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, whoamiResult, error) {
		return nil, whoamiResult{User: userOf(req.Extra.Header)}, nil
	})
	mcp.AddTool(s, &mcp.Tool{
		Name:        "read_ticket",
		Description: "Read one ticket.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: new(false)},
	}, func(_ context.Context, _ *mcp.CallToolRequest, in ticketArgs) (*mcp.CallToolResult, Ticket, error) {
		t, ok := tickets.get(in.TicketID)
		if !ok {
			return nil, Ticket{}, fmt.Errorf("no ticket %q", in.TicketID)
		}
		return nil, t, nil
	})
	mcp.AddTool(s, &mcp.Tool{
		Name:        "delete_ticket",
		Description: "Delete a ticket for good.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(true)},
	}, func(_ context.Context, _ *mcp.CallToolRequest, in ticketArgs) (*mcp.CallToolResult, any, error) {
		if !tickets.delete(in.TicketID) {
			return nil, nil, fmt.Errorf("no ticket %q", in.TicketID)
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "deleted " + in.TicketID}}}, nil, nil
	})
	return s
}

type ticketStore struct {
	mu      sync.Mutex
	tickets map[string]Ticket
}

func (s *ticketStore) get(id string) (Ticket, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tickets[id]
	return t, ok
}

func (s *ticketStore) delete(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.tickets[id]
	delete(s.tickets, id)
	return ok
}

// UnmarshalCaddyfile reads:
//
//	toolgate_demo
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() || d.NextBlock(d.Nesting()) {
		return d.Errf("toolgate_demo takes no options")
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)
