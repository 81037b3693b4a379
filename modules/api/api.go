// Package api is toolgate_api, the gateway's HTTP API for runners and their
// users: sessions, the service catalog, connections (stored credentials,
// and the OAuth connect flow), approvals, tool pins (for administrators),
// and the RFC 9728 protected-resource metadata. Every route but the metadata and the OAuth callback (which the
// provider redirects a browser to; its sealed state says who it is for)
// authenticates the caller like toolgate_session and acts for that caller
// only.
package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/account"
	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/cors"
	"github.com/toolgate/toolgate/internal/resourcemeta"
	"github.com/toolgate/toolgate/internal/toolpin"
	"github.com/toolgate/toolgate/internal/websession"
	"github.com/toolgate/toolgate/modules/gateway"
	"github.com/toolgate/toolgate/modules/session"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler serves the toolgate HTTP API. Requests it has no route for go to
// the next handler.
type Handler struct {
	app       *gateway.App
	approvals *approval.Manager // nil without a cipher
	pins      *toolpin.Pins
	browsers  *websession.Store
	mux       *http.ServeMux
	logger    *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.toolgate_api",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision finds the toolgate app and builds the routes.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	app, err := gateway.AppFor(ctx)
	if err != nil {
		return err
	}
	h.app = app
	h.app.RegisterAPI()
	// the browser that started a connect, judged by the console's terms
	if h.browsers, err = websession.For(h.app, 0); err != nil {
		return err
	}
	if h.pins, err = toolpin.For(h.app); err != nil {
		return err
	}
	if h.app.Cipher() != nil {
		if h.approvals, err = approval.For(ctx, h.app); err != nil {
			return err
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/oauth-protected-resource", h.resourceMetadata)
	mux.HandleFunc("GET /.well-known/oauth-protected-resource/{rest...}", h.resourceMetadata)
	mux.Handle("POST /v1/sessions", h.authenticated(h.createSession))
	mux.Handle("GET /v1/sessions", h.authenticated(h.listSessions))
	mux.Handle("GET /v1/sessions/{id}", h.authenticated(h.getSession))
	mux.Handle("DELETE /v1/sessions/{id}", h.authenticated(h.deleteSession))
	mux.Handle("GET /v1/catalog", h.authenticated(h.catalog))
	mux.Handle("PUT /v1/connections/{service}", h.authenticated(h.putConnection))
	mux.Handle("DELETE /v1/connections/{service}", h.authenticated(h.deleteConnection))
	mux.Handle("POST /v1/connections/{service}/authorize", h.authenticated(h.authorize))
	mux.Handle("POST /v1/connections/{service}/test", h.authenticated(h.testConnection))
	mux.Handle("GET /v1/approvals", h.authenticated(h.listApprovals))
	mux.Handle("GET /v1/approvals/{id}", h.authenticated(h.getApproval))
	mux.Handle("POST /v1/approvals/{id}/approve", h.authenticated(h.decideApproval(true)))
	mux.Handle("POST /v1/approvals/{id}/deny", h.authenticated(h.decideApproval(false)))
	mux.Handle("GET /v1/tool-pins", h.authenticated(h.listPins))
	mux.Handle("POST /v1/tool-pins/accept", h.authenticated(h.acceptPin))
	// The callback is opened by the user's browser, redirected by the
	// provider: the sealed state, not a bearer token, says who it is for.
	mux.HandleFunc("GET /v1/connections/{service}/callback", h.callback)
	h.mux = mux
	return nil
}

// ServeHTTP routes an API request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if cors.IsPreflight(r) && h.routed(r) {
		h.preflight(w, r)
		return nil
	}
	if _, pattern := h.mux.Handler(r); pattern == "" {
		if allowed := h.methods(r); len(allowed) > 0 {
			w.Header().Set("Allow", strings.Join(allowed, ", "))
			gateway.WriteAPIError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.URL.Path+" takes "+strings.Join(allowed, ", ")+", not "+r.Method)
			return nil
		}
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			gateway.WriteAPIError(w, http.StatusNotFound, "not_found", "no API route "+r.Method+" "+r.URL.Path)
			return nil
		}
		return next.ServeHTTP(w, r)
	}
	if gateway.InEarlyData(r) {
		gateway.WriteAPIError(w, http.StatusTooEarly, "too_early", gateway.TooEarlyText)
		return nil
	}
	if !h.app.Started(r.Context()) {
		w.Header().Set("Retry-After", "1")
		gateway.WriteAPIError(w, http.StatusServiceUnavailable, "unavailable", gateway.StartingText)
		return nil
	}
	if !h.app.CheckOrigin(r) {
		gateway.WriteAPIError(w, http.StatusForbidden, "origin_not_allowed", "origin or host not allowed (DNS-rebinding protection): add the origin to allowed_origins")
		return nil
	}
	cors.Allow(w, r)
	h.mux.ServeHTTP(w, r)
	return nil
}

// methods are the methods the API serves r's path with (none when it
// serves the path with none).
func (h *Handler) methods(r *http.Request) []string {
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
		probe := &http.Request{Method: m, URL: r.URL, Host: r.Host, Header: http.Header{}}
		if _, pattern := h.mux.Handler(probe); pattern != "" {
			allowed = append(allowed, m)
		}
	}
	return allowed
}

// preflight answers a browser's CORS preflight for an API route from an
// allowed origin (browser-based MCP clients read the metadata and may
// manage sessions); any other origin gets 403.
func (h *Handler) preflight(w http.ResponseWriter, r *http.Request) {
	if !h.app.CheckOrigin(r) {
		gateway.WriteAPIError(w, http.StatusForbidden, "origin_not_allowed", "origin or host not allowed (DNS-rebinding protection): add the origin to allowed_origins")
		return
	}
	cors.Preflight(w, r, "GET, POST, PUT, DELETE")
}

// routed reports whether the API has a route for r's path, whatever the
// method.
func (h *Handler) routed(r *http.Request) bool {
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := h.mux.Handler(probe); pattern != "" {
			return true
		}
	}
	return false
}

// authenticated wraps a route that acts for the authenticated caller.
func (h *Handler) authenticated(next func(http.ResponseWriter, *http.Request, *gateway.Caller)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		caller, err := h.app.Authenticate(r)
		if err != nil || caller.Method == "anonymous" {
			if err == nil {
				err = gateway.ErrNoCredentials
			}
			session.UnauthorizedAPI(w, r, h.app, err)
			return
		}
		next(w, r, caller)
	})
}

// resourceMetadata serves RFC 9728 protected-resource metadata: the
// gateway's, or an endpoint's (see package resourcemeta).
func (h *Handler) resourceMetadata(w http.ResponseWriter, r *http.Request) {
	path, ok := resourcemeta.DocumentPath(r)
	if !ok {
		gateway.WriteAPIError(w, http.StatusNotFound, "not_found", "no metadata for "+r.URL.Path)
		return
	}
	w.Header().Set("Cache-Control", "max-age=3600")
	gateway.WriteJSON(w, http.StatusOK, resourcemeta.Document(h.app, r, path))
}

const maxAPIBody = 64 << 10

// maxShownName bounds the bytes of a name the API's pages show from a URL.
const maxShownName = 256

// readJSON decodes a small JSON body strictly into v.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAPIBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		gateway.WriteAPIError(w, http.StatusBadRequest, "invalid_body", bodyError(err))
		return false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		gateway.WriteAPIError(w, http.StatusBadRequest, "invalid_body", "the body must hold exactly one JSON object")
		return false
	}
	return true
}

// bodyError says what is wrong with a body readJSON refused, in the API's
// words rather than Go's.
func bodyError(err error) string {
	var syntax *json.SyntaxError
	var kind *json.UnmarshalTypeError
	var tooLarge *http.MaxBytesError
	switch {
	case errors.Is(err, io.EOF):
		return "the body is empty: send a JSON object"
	case errors.As(err, &tooLarge):
		return fmt.Sprintf("the body is over %d bytes", tooLarge.Limit)
	case errors.As(err, &syntax), errors.Is(err, io.ErrUnexpectedEOF):
		return "the body is not JSON: send a JSON object"
	case errors.As(err, &kind) && kind.Field == "":
		return "the body must be a JSON object, not " + jsonKind(kind.Value)
	case errors.As(err, &kind):
		return fmt.Sprintf("%s must be %s, not %s", kind.Field, goKind(kind.Type), jsonKind(kind.Value))
	}
	if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return "unknown field " + field
	}
	return "the body must be a JSON object: " + err.Error()
}

// jsonKind names a JSON value's kind as encoding/json reports it.
func jsonKind(v string) string {
	switch v {
	case "array", "object":
		return "an " + v
	case "null":
		return "null"
	}
	return "a " + v
}

// goKind names what a field of type t takes, in JSON's words.
func goKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array of " + strings.TrimPrefix(strings.TrimPrefix(goKind(t.Elem()), "a "), "an ") + "s"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return goKind(t.Elem())
	}
	if t.Kind() >= reflect.Int && t.Kind() <= reflect.Float64 {
		return "a number"
	}
	return "a JSON " + t.Kind().String()
}

// sessionView is a session as the API shows it.
type sessionView struct {
	ID        string    `json:"id"`
	Services  []string  `json:"services"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

func viewSession(s *gateway.Session) sessionView {
	return sessionView{ID: s.ID, Services: s.Services, CreatedAt: s.CreatedAt, ExpiresAt: s.ExpiresAt}
}

// fail answers err: an account refusal as itself, anything else as an
// internal error.
func fail(w http.ResponseWriter, err error) {
	var refusal *account.Error
	if errors.As(err, &refusal) {
		gateway.WriteAPIError(w, refusal.Status, refusal.Code, refusal.Message)
		return
	}
	gateway.WriteAPIError(w, http.StatusInternalServerError, "internal", "internal error")
}

// createSession: POST /v1/sessions {"services": ["tracker"]}.
func (h *Handler) createSession(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	var body struct {
		Services []string `json:"services"`
	}
	if !readJSON(w, r, &body) {
		return
	}
	sess, err := account.CreateSession(r.Context(), h.app, caller, body.Services)
	if err != nil {
		fail(w, err)
		return
	}
	gateway.WriteJSON(w, http.StatusCreated, viewSession(sess))
}

func (h *Handler) getSession(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	sess, err := account.OwnSession(r.Context(), h.app, caller, r.PathValue("id"))
	if err != nil {
		fail(w, err)
		return
	}
	gateway.WriteJSON(w, http.StatusOK, viewSession(sess))
}

// listSessions: GET /v1/sessions — the caller's live sessions, newest
// first: never their ids, which only their creator saw, but the ref that
// ends each (DELETE /v1/sessions/{ref}).
func (h *Handler) listSessions(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	list, err := account.Sessions(r.Context(), h.app, caller)
	if err != nil {
		fail(w, err)
		return
	}
	type summary struct {
		Ref string `json:"ref"`
		gateway.SessionSummary
	}
	out := make([]summary, 0, len(list))
	for _, s := range list {
		out = append(out, summary{Ref: s.Ref, SessionSummary: s})
	}
	gateway.WriteJSON(w, http.StatusOK, map[string]any{"sessions": out})
}

// deleteSession: DELETE /v1/sessions/{id}, or a ref GET /v1/sessions
// listed.
func (h *Handler) deleteSession(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	ref, err := r.PathValue("id"), error(nil)
	if gateway.IsSessionRef(ref) {
		err = account.OwnSessionRef(r.Context(), h.app, caller, ref)
	} else {
		var sess *gateway.Session
		if sess, err = account.OwnSession(r.Context(), h.app, caller, ref); err == nil {
			ref = gateway.SessionRef(sess.ID)
		}
	}
	if err == nil {
		err = account.EndSession(r.Context(), h.app, caller, ref)
	}
	if err != nil {
		fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// catalog: GET /v1/catalog — the services the caller may use, never their
// URLs or credentials.
func (h *Handler) catalog(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	gateway.WriteJSON(w, http.StatusOK, map[string]any{"services": account.Catalog(r.Context(), h.app, caller)})
}

// service returns the service in the path if the caller may use it.
func (h *Handler) service(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) *gateway.Service {
	svc, err := account.Service(h.app, caller, r.PathValue("service"))
	if err != nil {
		fail(w, err)
		return nil
	}
	return svc
}

// putConnection: PUT /v1/connections/{service} {"token": "…"} stores a
// personal bearer token, encrypted, for a service with auth bearer.
func (h *Handler) putConnection(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	svc := h.service(w, r, caller)
	if svc == nil {
		return
	}
	var body struct {
		Token string `json:"token"`
	}
	if svc.Auth.Kind == gateway.AuthBearer && !readJSON(w, r, &body) {
		return
	}
	if err := account.StoreToken(r.Context(), h.app, caller, svc, body.Token); err != nil {
		fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// deleteConnection: DELETE /v1/connections/{service} forgets the caller's
// credential for the service (and revokes an OAuth grant at a provider
// with a revocation endpoint): 204, or 200 with what to do when the
// provider did not confirm the revocation.
func (h *Handler) deleteConnection(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	svc, err := account.ServiceToForget(r.Context(), h.app, caller, r.PathValue("service"))
	if err != nil {
		fail(w, err)
		return
	}
	notRevoked, err := account.Disconnect(r.Context(), h.app, caller, svc)
	if err != nil {
		fail(w, err)
		return
	}
	if notRevoked != "" {
		gateway.WriteJSON(w, http.StatusOK, map[string]any{"forgotten": true, "revoked": false, "message": notRevoked})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// testConnection: POST /v1/connections/{service}/test checks the caller's
// credential against the upstream.
func (h *Handler) testConnection(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	svc := h.service(w, r, caller)
	if svc == nil {
		return
	}
	gateway.WriteJSON(w, http.StatusOK, account.Test(r, h.app, caller, svc))
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
