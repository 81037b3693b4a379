// Package federation is toolgate_federation: one MCP endpoint (/v1/mcp)
// that shows every service of the runner's toolgate session at once, for
// runners that want one server rather than one per service. Tools and
// prompts appear as <service>__<name>, resources and resource templates
// with <service>__ before their URI and name (the separator is
// configurable); a call is routed to its service by that prefix.
//
// The federated endpoint is a thin layer in front of the pipeline, not a
// second one: toolgate answers the runner's initialize itself, and every
// other message becomes one or more messages to single services (package
// doc of subcall.go), each in an MCP session of that service that the
// federated session owns and initializes when it first needs it, with the
// runner's own initialize parameters. Each of them passes
// toolgate_registry and every step after it — allowlist, tool pins,
// request and result policy (which see the real service), the service's
// credential, the proxy — exactly as a call to /v1/mcp/{service} would.
// Lists are merged: a service that cannot be listed (down, not connected,
// a malformed list) leaves the others listed, is logged, and is named in
// the result's _meta["toolgate/unavailable"]; what one service lists is
// bounded like one of its messages. Notifications and server→client
// requests of every service reach the runner, the latter with ids that say
// which service the runner's answer goes back to.
//
// Services of one federated session share one runner, so each is kept to
// its own part of it: names and resource URIs (in lists, reads, and the
// blocks of results) carry the service's prefix, a service's cancellations
// name its own requests, and its progress reaches the runner only for
// requests that went to it.
package federation

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
	"github.com/toolgate/toolgate/modules/registry"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler serves the federated MCP endpoint. Requests for any other path
// (/v1/mcp/{service}) go on to the next handler unchanged.
type Handler struct {
	// Path is the federated endpoint's path. Default /v1/mcp.
	Path string `json:"path,omitempty"`

	// Separator joins a service id and a tool or prompt name (and comes
	// between a service id and a resource's URI or name): tracker__read_ticket.
	// No service id may contain it. Default "__".
	Separator string `json:"separator,omitempty"`

	app     *gateway.App
	limits  mcpmsg.Limits // of a runner's message
	answers mcpmsg.Limits // of a service's answer to a sub-call
	logger  *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.toolgate_federation",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Defaults.
const (
	defaultPath      = "/v1/mcp"
	defaultSeparator = "__"
)

// Service is the service of a federated MCP session: no service's, so that
// it can never be used at /v1/mcp/{service} (toolgate_registry answers 404
// for an MCP session of another service).
const Service = "*"

// Provision finds the toolgate app and checks the handler's place in the
// route and that the separator cannot be confused with a service id.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	app, err := gateway.AppFor(ctx)
	if err != nil {
		return err
	}
	h.app = app
	if err := h.app.ProvisionStep(gateway.StepFederation); err != nil {
		return err
	}
	if h.Path == "" {
		h.Path = defaultPath
	}
	h.Path = strings.TrimSuffix(h.Path, "/")
	if h.Separator == "" {
		h.Separator = defaultSeparator
	}
	h.limits = mcpmsg.Limits{MaxDepth: h.app.MaxJSONDepth, MaxValues: h.app.MaxRequestValues}
	h.answers = mcpmsg.Limits{MaxDepth: h.app.MaxJSONDepth, MaxValues: h.app.MaxResponseValues}
	return nil
}

// Validate checks the path and the separator against the registry.
func (h *Handler) Validate() error {
	if !strings.HasPrefix(h.Path, "/") {
		return fmt.Errorf("toolgate_federation: path %q must start with /", h.Path)
	}
	if strings.ContainsAny(h.Separator, " \t\r\n/") {
		return fmt.Errorf("toolgate_federation: separator %q must not hold spaces or /", h.Separator)
	}
	for _, svc := range h.app.Registry().Services() {
		// A name is cut at the separator's first occurrence, which must be
		// the one after the id: an id must not hold the separator, nor end
		// in its beginning ("svc_" + "__" + "x" reads as "svc" + "__" + "_x").
		if strings.Index(svc.ID+h.Separator, h.Separator) != len(svc.ID) {
			return fmt.Errorf("toolgate_federation: service %q holds the separator %q or ends in its beginning, so its tools could not be told from another service's; rename it or choose another separator", svc.ID, h.Separator)
		}
	}
	return nil
}

// ServeHTTP serves the federated endpoint, or hands any other request on.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if strings.TrimSuffix(r.URL.Path, "/") != h.Path {
		return next.ServeHTTP(w, r)
	}
	call := gateway.CallFrom(r)
	if call == nil {
		return caddyhttp.Error(http.StatusInternalServerError,
			errors.New("toolgate_federation must come after toolgate_session in the route"))
	}
	var fs *federated
	if ms := call.MCPSession; ms != nil {
		if fs = lookup(ms); fs == nil {
			gateway.WriteRPCError(w, http.StatusNotFound, nil, gateway.CodeSessionNotFound,
				"MCP session not found for this endpoint: initialize a new one", nil)
			return nil
		}
		defer ms.Begin()()
	}
	x := &exchange{h: h, w: w, r: r, next: next, call: call, fs: fs}
	switch r.Method {
	case http.MethodPost:
	case http.MethodGet, http.MethodDelete:
		if r.Method == http.MethodGet && !gateway.Bodyless(w, r) {
			return nil
		}
		if fs == nil {
			gateway.WriteRPCError(w, http.StatusBadRequest, nil, gateway.CodeInvalidRequest,
				"missing Mcp-Session-Id header: initialize first", nil)
			return nil
		}
		if r.Method == http.MethodGet {
			x.stream()
		} else {
			x.end()
		}
		return nil
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		gateway.WriteRPCError(w, http.StatusMethodNotAllowed, nil, gateway.CodeInvalidRequest,
			"method "+r.Method+" is not allowed on an MCP endpoint", nil)
		return nil
	}
	msg, held, ok := registry.ReadMessage(w, r, h.app, call.Caller.User, h.limits)
	defer held.Release() // the body is the call's until it is answered
	if !ok {
		return nil
	}
	x.msg = msg
	isInit := msg.Kind == mcpmsg.Request && msg.Method == "initialize"
	if fs == nil && !isInit && mcp2026.IsStateless(r, msg) {
		gateway.WriteRPCError(w, http.StatusBadRequest, msg.ID, gateway.CodeInvalidRequest,
			"the federated endpoint serves runners that initialize a session; a runner of the stateless revision "+
				mcp2026.Version+" uses each service's endpoint ("+h.Path+"/{service})", nil)
		return nil
	}
	switch {
	case isInit && fs != nil:
		gateway.WriteRPCError(w, http.StatusBadRequest, msg.ID, gateway.CodeInvalidRequest, "initialize must not carry an Mcp-Session-Id", nil)
	case isInit:
		x.initialize()
	case fs == nil:
		gateway.WriteRPCError(w, http.StatusBadRequest, msg.ID, gateway.CodeInvalidRequest, "missing Mcp-Session-Id header: initialize first", nil)
	case msg.Kind == mcpmsg.Request:
		x.request()
	case msg.Kind == mcpmsg.Response:
		x.answerServer()
	default:
		x.notification()
	}
	return nil
}

// exchange is one runner request to the federated endpoint.
type exchange struct {
	h    *Handler
	w    http.ResponseWriter
	r    *http.Request
	next caddyhttp.Handler
	call *gateway.Call
	fs   *federated
	msg  mcpmsg.Message
}

// services are the services of the runner's session it may use, in the
// session's order.
func (x *exchange) services() []*gateway.Service {
	var out []*gateway.Service
	for _, id := range x.call.Session.Services {
		if svc := x.h.app.Registry().Lookup(id); svc != nil && svc.AllowsUser(x.call.Caller.User) {
			out = append(out, svc)
		}
	}
	return out
}

// split finds the service a federated name (or URI) is for: the one whose
// id and the separator it starts with. It returns the service and the
// name as the service knows it.
func (x *exchange) split(name string) (*gateway.Service, string, bool) {
	id, rest, ok := strings.Cut(name, x.h.Separator)
	if !ok || rest == "" {
		return nil, "", false
	}
	for _, svc := range x.services() {
		if svc.ID == id {
			return svc, rest, true
		}
	}
	return nil, "", false
}

// federated is this replica's copy of one federated MCP session: what the
// runner initialized with, and the MCP session it has with each service.
// What another replica needs of it is stored with the MCP session itself:
// the runner's initialize (as any session's) and, for each service, the
// session with it (mcpstate.Record.Links), which any replica opens.
type federated struct {
	// init is replayed to initialize each service's MCP session: the
	// negotiated protocolVersion, the runner's capabilities and clientInfo.
	init []byte

	mu       sync.Mutex
	children map[string]*child
	inflight map[string]string // the key of a runner request's id → its service (requests in flight here)
	progress map[string]string // the key of such a request's progress token → its service
}

// child is the MCP session a federated session has with one service.
type child struct {
	mu           sync.Mutex // held while it is initialized or opened
	ms           *gateway.MCPSession
	capabilities gjson.Result // the service's, from its initialize result
}

// sessions holds this replica's copies of federated sessions by MCP
// session id; like the MCP sessions themselves, they outlive config
// reloads, and each goes when this replica's copy of its MCP session does.
var sessions sync.Map // string → *federated

// remember makes ms a federated session here, initialized with init.
func remember(ms *gateway.MCPSession, init []byte) *federated {
	fs := &federated{init: init, children: map[string]*child{}, inflight: map[string]string{}, progress: map[string]string{}}
	if v, loaded := sessions.LoadOrStore(ms.ID, fs); loaded {
		return v.(*federated)
	}
	context.AfterFunc(ms.Context(), func() { sessions.CompareAndDelete(ms.ID, fs) })
	return fs
}

// lookup returns the federated session ms is, or nil when it is not one:
// a session initialized at the federated endpoint, here or on another
// replica.
func lookup(ms *gateway.MCPSession) *federated {
	if ms.Service != Service {
		return nil
	}
	if v, ok := sessions.Load(ms.ID); ok {
		return v.(*federated)
	}
	init := ms.Upstream().InitializeParams
	if len(init) == 0 || ms.Closed() {
		return nil
	}
	return remember(ms, init)
}

func (fs *federated) child(service string) *child {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	c := fs.children[service]
	if c == nil {
		c = new(child)
		fs.children[service] = c
	}
	return c
}

// started returns the services' MCP sessions that are open: those opened
// here and those another replica linked to the session (opened here now),
// waiting for any being initialized.
func (x *exchange) started() map[string]*gateway.MCPSession {
	out := map[string]*gateway.MCPSession{}
	for service, link := range x.call.MCPSession.Links() {
		c := x.fs.child(service)
		c.mu.Lock()
		if c.ms == nil || c.ms.Closed() {
			if err := x.adopt(x.r.Context(), c, link); err != nil && !errors.Is(err, gateway.ErrMCPSessionNotFound) {
				x.h.logger.Warn("cannot open a federated session's MCP session with a service", zap.String("service", service), zap.Error(err))
			}
		}
		c.mu.Unlock()
	}
	x.fs.mu.Lock()
	children := make(map[string]*child, len(x.fs.children))
	for id, c := range x.fs.children {
		children[id] = c
	}
	x.fs.mu.Unlock()
	for id, c := range children {
		c.mu.Lock()
		if c.ms != nil && !c.ms.Closed() {
			out[id] = c.ms
		}
		c.mu.Unlock()
	}
	return out
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
