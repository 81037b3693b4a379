// Package session is toolgate_session, the first step of the pipeline: it
// authenticates the caller, checks the browser origin, and resolves the
// caller's toolgate session and MCP session. It starts the request's
// gateway.Call.
package session

import (
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler authenticates runners. The runner's own Authorization header is
// only read here; it is never forwarded upstream.
type Handler struct {
	app    *gateway.App
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.toolgate_session",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision finds the toolgate app.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	app, err := ctx.App("toolgate")
	if err != nil {
		return err
	}
	h.app = app.(*gateway.App)
	return h.app.ProvisionStep(gateway.StepSession)
}

// ServeHTTP starts the call or answers 401/403/404.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !h.app.CheckOrigin(r) {
		gateway.WriteRPCError(w, http.StatusForbidden, nil, gateway.CodeInvalidRequest,
			"origin or host not allowed (DNS-rebinding protection): add the origin to allowed_origins", nil)
		return nil
	}
	caller, err := h.app.Authenticate(r)
	if err != nil {
		Unauthorized(w, r, h.app, err)
		return nil
	}
	call := &gateway.Call{Started: time.Now(), Caller: caller, RemoteIP: clientIP(r)}

	// The toolgate session: chosen services, owned by this caller.
	if id := r.Header.Get(h.app.SessionHeaderName()); id != "" {
		sess, err := h.app.Sessions().Get(r.Context(), id)
		switch {
		case errors.Is(err, gateway.ErrSessionNotFound):
			forbidden(w, "toolgate session not found or expired: create one with POST /v1/sessions")
			return nil
		case err != nil:
			h.logger.Error("reading session", zap.Error(err))
			gateway.WriteRPCError(w, http.StatusServiceUnavailable, nil, gateway.CodeUnavailable,
				"session storage is unavailable; try again", gateway.Retryable)
			return nil
		case sess.User != caller.User:
			forbidden(w, "this toolgate session belongs to another caller")
			return nil
		}
		call.Session = sess
	} else if caller.Method == "anonymous" {
		call.Session = h.app.AnonymousSession(caller)
	} else {
		forbidden(w, "a toolgate session is required: create one with POST /v1/sessions and send its id in the "+
			h.app.SessionHeaderName()+" header")
		return nil
	}

	// The MCP session, once the runner has initialized. A request of the
	// stateless revision has none: an Mcp-Session-Id it carries is ignored.
	if id := r.Header.Get("Mcp-Session-Id"); id != "" && !mcp2026.ModernHeader(r) {
		ms, err := h.app.MCPSessions().Get(id)
		if err != nil {
			// 404 tells an MCP client to initialize a new session.
			gateway.WriteRPCError(w, http.StatusNotFound, nil, gateway.CodeSessionNotFound,
				"MCP session not found or expired: initialize a new one", nil)
			return nil
		}
		if ms.User != caller.User || ms.SessionID != call.Session.ID {
			forbidden(w, "this MCP session belongs to another caller or toolgate session")
			return nil
		}
		call.MCPSession = ms
	}
	return next.ServeHTTP(w, gateway.WithCall(r, call))
}

func forbidden(w http.ResponseWriter, message string) {
	gateway.WriteRPCError(w, http.StatusForbidden, nil, gateway.CodeInvalidRequest, message, nil)
}

// clientIP is the client address Caddy determined (honouring
// trusted_proxies), without the port.
func clientIP(r *http.Request) string {
	if ip, ok := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); ok && ip != "" {
		return ip
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// Unauthorized answers 401 with the RFC 9728 pointer to the gateway's
// protected-resource metadata, so MCP clients can find how to sign in.
func Unauthorized(w http.ResponseWriter, r *http.Request, app *gateway.App, err error) {
	challenge := `Bearer resource_metadata="` + app.ResourceMetadataURL(r) + `"`
	if !errors.Is(err, gateway.ErrNoCredentials) {
		challenge += `, error="invalid_token"`
	}
	w.Header().Set("WWW-Authenticate", challenge)
	gateway.WriteRPCError(w, http.StatusUnauthorized, nil, gateway.CodeInvalidRequest, err.Error(), nil)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
