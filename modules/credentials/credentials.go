// Package credentials is toolgate_credentials, the fourth step of the
// pipeline: it finds the credential the upstream needs for this caller —
// a service-wide header, the caller's own stored token, or the caller's
// OAuth access token, refreshed by the gateway when it is within the
// service's refresh_skew of expiry — and hands it to the proxy. No request
// reaches an upstream that needs a credential without one.
package credentials

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler attaches upstream credentials to the call.
type Handler struct {
	app    *gateway.App
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.toolgate_credentials",
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
	return h.app.ProvisionStep(gateway.StepCredentials)
}

// ServeHTTP sets call.Credential or answers needs_sign_in / retryable.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	call := gateway.CallFrom(r)
	if call == nil || call.Service == nil {
		return caddyhttp.Error(http.StatusInternalServerError,
			errors.New("toolgate_credentials must come after toolgate_session and toolgate_registry in the route"))
	}
	ctx, span := gateway.StartSpan(r.Context(), "toolgate.credentials",
		attribute.String("toolgate.service", call.Service.ID), attribute.String("toolgate.auth", string(call.Service.Auth.Kind)))
	cred, err := h.app.CredentialFor(ctx, call.Service, call.Caller.User)
	if err != nil && r.Method == http.MethodDelete && call.MCPSession != nil && gateway.IsSignInError(err) {
		// Ending a session is always possible, connected or not: it goes
		// on without a credential. The proxy ends the MCP session; a
		// transport module (a program, a legacy SSE connection) ends its
		// own session and stream, and a server is sent nothing (the
		// upstream forgets the session at its own idle timeout).
		span.End()
		return next.ServeHTTP(w, r)
	}
	if err != nil {
		gateway.EndSpan(span, errorKind(err))
		h.fail(w, r, call, err)
		return nil
	}
	span.End()
	call.Credential = cred
	return next.ServeHTTP(w, r)
}

// fail answers a call whose credential could not be had: needs_sign_in
// (with a connect URL) when the user must connect the service, a retryable
// error otherwise. Messages never carry tokens or provider answers.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, call *gateway.Call, err error) {
	svc := call.Service
	if gateway.IsSignInError(err) {
		data := h.app.NeedsSignIn(r, svc)
		msg := "you have not connected " + svc.ID + " yet: connect it " + gateway.ConnectHint(data) + ", then retry"
		switch {
		case errors.Is(err, gateway.ErrGrantRejected):
			msg = "the provider no longer accepts your " + svc.ID + " sign-in: connect it again " + gateway.ConnectHint(data) + ", then retry"
		case errors.Is(err, gateway.ErrGrantExpired):
			msg = "your " + svc.ID + " sign-in expired: connect it again " + gateway.ConnectHint(data) + ", then retry"
		case errors.Is(err, gateway.ErrSealedWithOtherKey):
			// Stored before the reset, and the cipher opens the canary:
			// this record never opens again.
			h.logger.Warn("a stored connection from before the cipher's reset does not open with the cipher's key, which opens the canary: it was sealed with the key the reset replaced; its person is asked to connect again",
				zap.String("service", svc.ID), zap.Error(err))
			msg = "your " + svc.ID + " connection was stored with a key toolgate no longer uses (an administrator replaced it): connect it again " + gateway.ConnectHint(data) + ", then retry"
		}
		gateway.AuditRefused(call, gateway.StepCredentials, msg)
		call.Fail(w, http.StatusForbidden, gateway.CodeNeedsSignIn, msg, data)
		return
	}
	h.logger.Error("cannot attach the upstream credential", zap.String("service", svc.ID), zap.Error(err))
	why := "the credential for " + svc.ID + " is unavailable (" + errorKind(err) + "); retry later"
	gateway.AuditRefused(call, gateway.StepCredentials, why)
	call.Unavailable(w, why)
}

func errorKind(err error) string {
	switch {
	case errors.Is(err, gateway.ErrProviderUnavailable):
		return "the OAuth provider is unavailable"
	case errors.Is(err, gateway.ErrCipherUnavailable):
		return "cipher unavailable"
	case errors.Is(err, gateway.ErrStorageUnavailable):
		return "storage unavailable"
	case errors.Is(err, gateway.ErrCipherRefused):
		return "the cipher refused toolgate: an administrator must check its configuration and the gateway's log"
	}
	return "internal error"
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
