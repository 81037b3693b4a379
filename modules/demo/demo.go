// Package demo is toolgate_demo: a small fictional work tracker, served as
// an MCP server (built with the official MCP Go SDK) together with its own
// OAuth 2 authorization server (built with github.com/go-oauth2/oauth2/v4),
// so the gateway has something to front out of the box. It is what
// caddyfile/demo.Caddyfile runs on a second local port. It is not meant for
// production.
//
// The tracker knows four tools: whoami and read_ticket (read-only),
// comment_ticket (it changes a ticket but destroys nothing: the default
// policy asks a person to approve it) and delete_ticket (destructive; the
// demo registry does not allowlist it). It
// accepts only access tokens its provider issued. The provider, at
// /oauth/authorize and /oauth/token, has no login page: it approves every
// authorization at once for the user the login_hint parameter names (or
// "demo-user"), issues short-lived access tokens (45s by default) and
// rotates the refresh token on every refresh. whoami reports the user and
// how many refreshes the grant has been through.
//
// Grants live in memory: a restart or a config reload forgets them, and
// users connect again.
package demo

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
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

// Handler serves the demo tracker: its OAuth provider at /oauth/authorize
// and /oauth/token, and its MCP endpoint at every other path.
type Handler struct {
	// ClientID is the one OAuth client the provider knows. Default
	// "toolgate-demo".
	ClientID string `json:"client_id,omitempty"`

	// ClientSecret is that client's secret. Default
	// "demo-only-tracker-secret"; "-" makes it a public client (no
	// secret).
	ClientSecret string `json:"client_secret,omitempty"`

	// RedirectURI is the client's one redirect URI; authorization requests
	// must use exactly it. Default
	// http://127.0.0.1:8080/v1/connections/tracker/callback (the demo
	// gateway's callback for its tracker service).
	RedirectURI string `json:"redirect_uri,omitempty"`

	// AccessTokenLifetime is how long an access token works. Default 45s.
	AccessTokenLifetime caddy.Duration `json:"access_token_lifetime,omitempty"`

	mcp      http.Handler
	provider *provider
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.toolgate_demo",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Defaults of the demo provider.
const (
	DefaultClientID            = "toolgate-demo"
	DefaultClientSecret        = "demo-only-tracker-secret"
	DefaultRedirectURI         = "http://127.0.0.1:8080/v1/connections/tracker/callback"
	DefaultAccessTokenLifetime = 45 * time.Second
)

// Provision builds the tracker and its provider.
func (h *Handler) Provision(caddy.Context) error {
	if h.ClientID == "" {
		h.ClientID = DefaultClientID
	}
	switch h.ClientSecret {
	case "":
		h.ClientSecret = DefaultClientSecret
	case "-":
		h.ClientSecret = ""
	}
	if h.RedirectURI == "" {
		h.RedirectURI = DefaultRedirectURI
	}
	if h.AccessTokenLifetime <= 0 {
		h.AccessTokenLifetime = caddy.Duration(DefaultAccessTokenLifetime)
	}
	p, err := newProvider(h)
	if err != nil {
		return fmt.Errorf("toolgate_demo: building the OAuth provider: %v", err)
	}
	h.provider = p
	server := NewServer(func(ctx context.Context, hdr http.Header) (string, int) {
		g, _ := h.grantOf(ctx, hdr)
		return g.User, g.Refreshes
	})
	h.mcp = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{SessionTimeout: 30 * time.Minute})
	return nil
}

// ServeHTTP serves the provider's endpoints, or checks the access token
// and serves MCP.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	switch r.URL.Path {
	case "/oauth/authorize":
		h.provider.authorize(w, r)
		return nil
	case "/oauth/token":
		h.provider.token(w, r)
		return nil
	}
	if _, ok := h.grantOf(r.Context(), r.Header); !ok {
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		http.Error(w, "the tracker wants an access token from its provider (/oauth/authorize)", http.StatusUnauthorized)
		return nil
	}
	h.mcp.ServeHTTP(w, r)
	return nil
}

// grantOf validates the request's bearer token.
func (h *Handler) grantOf(ctx context.Context, hdr http.Header) (grant, bool) {
	token, ok := strings.CutPrefix(hdr.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		return grant{}, false
	}
	return h.provider.lookup(ctx, token)
}

type ticketArgs struct {
	TicketID string `json:"ticket_id" jsonschema:"the ticket id, such as TEST-123"`
}

// Ticket is one tracker ticket.
type Ticket struct {
	ID       string    `json:"id"`
	Title    string    `json:"title"`
	Status   string    `json:"status"`
	Body     string    `json:"body"`
	Comments []Comment `json:"comments,omitempty"`
}

// Comment is one comment on a ticket.
type Comment struct {
	By   string `json:"by"`
	Text string `json:"text"`
}

type commentArgs struct {
	TicketID string `json:"ticket_id" jsonschema:"the ticket, e.g. TEST-123"`
	Comment  string `json:"comment" jsonschema:"the comment's text"`
}

type whoamiResult struct {
	User string `json:"user"`
	// RefreshCount is how many times the caller's grant was refreshed.
	RefreshCount int `json:"refresh_count"`
}

// Identify tells which user a request's credential belongs to, and how many
// times its grant was refreshed.
type Identify func(ctx context.Context, h http.Header) (user string, refreshes int)

// NewServer returns the tracker's MCP server with a fresh set of tickets.
func NewServer(identify Identify) *mcp.Server {
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
	}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, whoamiResult, error) {
		user, refreshes := identify(ctx, req.Extra.Header)
		return nil, whoamiResult{User: user, RefreshCount: refreshes}, nil
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
		Name:        "comment_ticket",
		Description: "Add a comment to a ticket.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false), IdempotentHint: false, OpenWorldHint: new(false)},
	}, func(ctx context.Context, req *mcp.CallToolRequest, in commentArgs) (*mcp.CallToolResult, Ticket, error) {
		user, _ := identify(ctx, req.Extra.Header)
		t, ok := tickets.comment(in.TicketID, user, in.Comment)
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

func (s *ticketStore) comment(id, by, text string) (Ticket, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tickets[id]
	if !ok {
		return t, false
	}
	t.Comments = append(t.Comments[:len(t.Comments):len(t.Comments)], Comment{By: by, Text: text})
	s.tickets[id] = t
	return t, true
}

func (s *ticketStore) delete(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.tickets[id]
	delete(s.tickets, id)
	return ok
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
