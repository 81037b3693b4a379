// Package session is toolgate_session, the first step of the pipeline: it
// checks the browser origin (and answers browsers' CORS preflights),
// authenticates the caller, and resolves the caller's toolgate session —
// the one named in the session header, or one implied for a runner that
// sends none (package impliedsession) — and MCP session. It starts the
// request's gateway.Call.
package session

import (
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/cors"
	"github.com/toolgate/toolgate/internal/impliedsession"
	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/resourcemeta"
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
	app, err := gateway.AppFor(ctx)
	if err != nil {
		return err
	}
	h.app = app
	return h.app.ProvisionStep(gateway.StepSession)
}

// ServeHTTP starts the call or answers 401/403/404. A browser's preflight
// from an allowed origin is answered here, before authentication: it
// carries no credentials. Whichever step refuses the call, the runner gets
// the refusal even while it is still sending a large body
// (gateway.AnswerBeforeBody).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	early := gateway.AnswerBeforeBody(w, r, h.app.MaxRequestBytes)
	err := h.serve(w, r, next)
	if err != nil { // Caddy has yet to write the error
		early.CloseAfterAnswer()
		return err
	}
	early.Finish()
	return nil
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !h.app.Started(r.Context()) {
		gateway.WriteStarting(w)
		return nil
	}
	if gateway.InEarlyData(r) {
		gateway.WriteRPCError(w, http.StatusTooEarly, nil, gateway.CodeInvalidRequest, gateway.TooEarlyText, nil)
		return nil
	}
	if !h.app.CheckOrigin(r) {
		gateway.WriteRPCError(w, http.StatusForbidden, nil, gateway.CodeInvalidRequest,
			"origin or host not allowed (DNS-rebinding protection): add the origin to allowed_origins", nil)
		return nil
	}
	if cors.IsPreflight(r) {
		cors.Preflight(w, r, cors.MCPMethods, h.app.SessionHeaderName())
		return nil
	}
	cors.Allow(w, r)
	caller, err := h.app.AuthenticateEndpoint(r)
	if err != nil {
		Unauthorized(w, r, h.app, err)
		return nil
	}
	call := &gateway.Call{Started: time.Now(), Caller: caller, RemoteIP: clientIP(r)}

	// The toolgate session: chosen services, owned by this caller.
	explicit := r.Header.Get(h.app.SessionHeaderName())
	if explicit != "" {
		sess, err := h.app.Sessions().Get(r.Context(), explicit)
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
			foreign(w, call, "this toolgate session belongs to another caller")
			return nil
		}
		call.Session = sess
	} else if caller.Method == "anonymous" {
		call.Session = h.app.AnonymousSession(caller)
	} else if impliedsession.Required(h.app) {
		forbidden(w, "a toolgate session is required (require_session): create one with POST /v1/sessions and send its id in the "+
			h.app.SessionHeaderName()+" header")
		return nil
	}

	// The MCP session, once the runner has initialized. A request of the
	// stateless revision has none: an Mcp-Session-Id it carries is ignored.
	if id := r.Header.Get("Mcp-Session-Id"); id != "" && !mcp2026.ModernHeader(r) {
		named := ""
		if call.Session != nil {
			named = call.Session.ID
		}
		ms, err := h.app.MCPSessions().Open(r.Context(), id, caller.User, named)
		switch {
		case errors.Is(err, gateway.ErrMCPSessionNotFound):
			// 404 tells an MCP client to initialize a new session.
			gateway.WriteRPCError(w, http.StatusNotFound, nil, gateway.CodeSessionNotFound,
				"MCP session not found or expired: initialize a new one", nil)
			return nil
		case errors.Is(err, gateway.ErrMCPSessionForeign):
			foreign(w, call, "this MCP session belongs to another caller or toolgate session")
			return nil
		case err != nil:
			h.logger.Error("reading the MCP session", zap.Error(err))
			gateway.WriteRPCError(w, http.StatusServiceUnavailable, nil, gateway.CodeUnavailable,
				"toolgate's storage is unavailable; try again", gateway.Retryable)
			return nil
		}
		if call.Session == nil {
			sess, ok := impliedsession.Of(h.app, caller, ms)
			if !ok {
				forbidden(w, "this MCP session belongs to another caller, or was started in a toolgate session: send that session's id in the "+
					h.app.SessionHeaderName()+" header")
				return nil
			}
			call.Session = sess
		}
		if ms.User != caller.User || ms.SessionID != call.Session.ID {
			foreign(w, call, "this MCP session belongs to another caller or toolgate session")
			return nil
		}
		call.MCPSession = ms
	} else if call.Session == nil && mcp2026.ModernHeader(r) {
		call.Session = impliedsession.ForStateless(h.app, caller)
	} else if call.Session == nil {
		// No session header and no MCP session yet: the runner's
		// initialize starts an implied session.
		call.Session = impliedsession.New(h.app, caller)
	}
	return next.ServeHTTP(w, gateway.WithCall(r, call))
}

// foreign refuses a request naming a session of another caller: an attempt
// the audit trail records, with the caller who made it.
func foreign(w http.ResponseWriter, call *gateway.Call, message string) {
	gateway.AuditRefused(call, gateway.StepSession, message)
	forbidden(w, message)
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

// Unauthorized answers 401 with the RFC 9728 pointer to the protected-
// resource metadata of the endpoint r is for, so MCP clients can find how
// to sign in (package resourcemeta).
func Unauthorized(w http.ResponseWriter, r *http.Request, app *gateway.App, err error) {
	unauthorized(w, resourcemeta.Challenge(app, r, resourcemeta.EndpointPath(r), err), err)
}

// UnauthorizedAPI answers 401 for a request to the HTTP API, whose
// resource is the gateway itself, with the API's error body.
func UnauthorizedAPI(w http.ResponseWriter, r *http.Request, app *gateway.App, err error) {
	w.Header().Set("WWW-Authenticate", resourcemeta.Challenge(app, r, "", err))
	gateway.WriteAPIError(w, http.StatusUnauthorized, "unauthorized", err.Error())
}

func unauthorized(w http.ResponseWriter, challenge string, err error) {
	w.Header().Set("WWW-Authenticate", challenge)
	gateway.WriteRPCError(w, http.StatusUnauthorized, nil, gateway.CodeInvalidRequest, err.Error(), nil)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
