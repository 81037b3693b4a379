// Package api is toolgate_api, the gateway's HTTP API for runners and their
// users: sessions, the service catalog, connections (stored credentials,
// and the OAuth connect flow), and the RFC 9728 protected-resource
// metadata. Every route but the metadata and the OAuth callback (which the
// provider redirects a browser to; its signed state says who it is for)
// authenticates the caller like toolgate_session and acts for that caller
// only.
package api

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/gateway"
	"github.com/toolgate/toolgate/modules/session"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler serves the toolgate HTTP API. Requests it has no route for go to
// the next handler.
type Handler struct {
	app    *gateway.App
	mux    *http.ServeMux
	logger *zap.Logger
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
	app, err := ctx.App("toolgate")
	if err != nil {
		return err
	}
	h.app = app.(*gateway.App)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/oauth-protected-resource", h.resourceMetadata)
	mux.HandleFunc("GET /.well-known/oauth-protected-resource/{rest...}", h.resourceMetadata)
	mux.Handle("POST /v1/sessions", h.authenticated(h.createSession))
	mux.Handle("GET /v1/sessions/{id}", h.authenticated(h.getSession))
	mux.Handle("DELETE /v1/sessions/{id}", h.authenticated(h.deleteSession))
	mux.Handle("GET /v1/catalog", h.authenticated(h.catalog))
	mux.Handle("PUT /v1/connections/{service}", h.authenticated(h.putConnection))
	mux.Handle("DELETE /v1/connections/{service}", h.authenticated(h.deleteConnection))
	mux.Handle("POST /v1/connections/{service}/authorize", h.authenticated(h.authorize))
	mux.Handle("POST /v1/connections/{service}/test", h.authenticated(h.testConnection))
	// The callback is opened by the user's browser, redirected by the
	// provider: the signed state, not a bearer token, says who it is for.
	mux.HandleFunc("GET /v1/connections/{service}/callback", h.callback)
	h.mux = mux
	return nil
}

// ServeHTTP routes an API request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if _, pattern := h.mux.Handler(r); pattern == "" {
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			gateway.WriteAPIError(w, http.StatusNotFound, "not_found", "no API route "+r.Method+" "+r.URL.Path)
			return nil
		}
		return next.ServeHTTP(w, r)
	}
	if !h.app.CheckOrigin(r) {
		gateway.WriteAPIError(w, http.StatusForbidden, "origin_not_allowed", "origin or host not allowed (DNS-rebinding protection): add the origin to allowed_origins")
		return nil
	}
	h.mux.ServeHTTP(w, r)
	return nil
}

// authenticated wraps a route that acts for the authenticated caller.
func (h *Handler) authenticated(next func(http.ResponseWriter, *http.Request, *gateway.Caller)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		caller, err := h.app.Authenticate(r)
		if err != nil || caller.Method == "anonymous" {
			if err == nil {
				err = gateway.ErrNoCredentials
			}
			session.Unauthorized(w, r, h.app, err)
			return
		}
		next(w, r, caller)
	})
}

// resourceMetadata serves RFC 9728 protected-resource metadata.
func (h *Handler) resourceMetadata(w http.ResponseWriter, r *http.Request) {
	base := h.app.BaseURL(r)
	resource := base + "/v1/mcp"
	if rest := r.PathValue("rest"); rest != "" {
		resource = base + "/" + rest
	}
	var servers []string
	for _, j := range h.app.Auth.JWT {
		servers = append(servers, j.Issuer)
	}
	meta := map[string]any{
		"resource":                 resource,
		"bearer_methods_supported": []string{"header"},
		"resource_name":            "toolgate MCP gateway",
	}
	if len(servers) > 0 {
		meta["authorization_servers"] = servers
	}
	w.Header().Set("Cache-Control", "max-age=3600")
	gateway.WriteJSON(w, http.StatusOK, meta)
}

const maxAPIBody = 64 << 10

// readJSON decodes a small JSON body strictly into v.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAPIBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		gateway.WriteAPIError(w, http.StatusBadRequest, "invalid_body", "the body must be a JSON object: "+err.Error())
		return false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		gateway.WriteAPIError(w, http.StatusBadRequest, "invalid_body", "the body must hold exactly one JSON object")
		return false
	}
	return true
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

// createSession: POST /v1/sessions {"services": ["tracker"]}. Unknown or
// disallowed services fail before anything is stored.
func (h *Handler) createSession(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	var body struct {
		Services []string `json:"services"`
	}
	if !readJSON(w, r, &body) {
		return
	}
	if len(body.Services) == 0 {
		gateway.WriteAPIError(w, http.StatusBadRequest, "invalid_body", `list the services the session may use: {"services": ["…"]}`)
		return
	}
	seen := map[string]bool{}
	services := make([]string, 0, len(body.Services))
	for _, id := range body.Services {
		svc := h.app.Registry().Lookup(id)
		if svc == nil || !svc.AllowsUser(caller.User) {
			gateway.WriteAPIError(w, http.StatusNotFound, "unknown_service", "unknown service "+id)
			return
		}
		if !seen[id] {
			seen[id] = true
			services = append(services, id)
		}
	}
	sess, err := h.app.Sessions().Create(r.Context(), caller.User, services)
	if errors.Is(err, gateway.ErrTooManySessions) {
		gateway.WriteAPIError(w, http.StatusTooManyRequests, "too_many_sessions", err.Error())
		return
	}
	if err != nil {
		h.logger.Error("creating session", zap.Error(err))
		gateway.WriteAPIError(w, http.StatusServiceUnavailable, "storage_unavailable", "the session could not be stored; try again")
		return
	}
	gateway.WriteJSON(w, http.StatusCreated, viewSession(sess))
}

// ownSession loads the session in the path if it belongs to caller.
func (h *Handler) ownSession(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) *gateway.Session {
	sess, err := h.app.Sessions().Get(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, gateway.ErrSessionNotFound):
		gateway.WriteAPIError(w, http.StatusNotFound, "session_not_found", "session not found or expired")
		return nil
	case err != nil:
		h.logger.Error("reading session", zap.Error(err))
		gateway.WriteAPIError(w, http.StatusServiceUnavailable, "storage_unavailable", "the session could not be read; try again")
		return nil
	case sess.User != caller.User:
		gateway.WriteAPIError(w, http.StatusForbidden, "forbidden", "this session belongs to another caller")
		return nil
	}
	return sess
}

func (h *Handler) getSession(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	if sess := h.ownSession(w, r, caller); sess != nil {
		gateway.WriteJSON(w, http.StatusOK, viewSession(sess))
	}
}

func (h *Handler) deleteSession(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	sess := h.ownSession(w, r, caller)
	if sess == nil {
		return
	}
	if err := h.app.Sessions().Delete(r.Context(), sess); err != nil {
		h.logger.Error("deleting session", zap.Error(err))
		gateway.WriteAPIError(w, http.StatusServiceUnavailable, "storage_unavailable", "the session could not be deleted; try again")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Connection statuses in the catalog.
const (
	statusConnected   = "connected"
	statusNeedsSignIn = "needs_sign_in"
	statusExpired     = "expired"
	statusUnavailable = "unavailable"
)

type catalogEntry struct {
	ID         string          `json:"id"`
	Title      string          `json:"title,omitempty"`
	Auth       string          `json:"auth"`
	Status     string          `json:"status"`
	Tools      []string        `json:"tools"`
	Connection *connectionView `json:"connection,omitempty"`
}

// connectionView is what the catalog tells about a stored credential:
// never the tokens.
type connectionView struct {
	ConnectedAt  time.Time `json:"connected_at"`
	ExpiresAt    time.Time `json:"expires_at,omitzero"`
	Scopes       []string  `json:"scopes,omitempty"`
	RefreshCount int       `json:"refresh_count"`
	RefreshedAt  time.Time `json:"refreshed_at,omitzero"`
}

func viewConnection(c *gateway.Connection) *connectionView {
	return &connectionView{ConnectedAt: c.ConnectedAt, ExpiresAt: c.Expiry, Scopes: c.Scopes,
		RefreshCount: c.RefreshCount, RefreshedAt: c.RefreshedAt}
}

// catalog: GET /v1/catalog — the services the caller may use, never their
// URLs or credentials.
func (h *Handler) catalog(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	entries := []catalogEntry{}
	for _, svc := range h.app.Registry().Services() {
		if !svc.AllowsUser(caller.User) {
			continue
		}
		status, conn := h.connectionStatus(r, svc, caller)
		entry := catalogEntry{ID: svc.ID, Title: svc.Title, Auth: svc.Auth.Kind, Status: status, Tools: svc.Tools}
		if conn != nil {
			entry.Connection = viewConnection(conn)
		}
		entries = append(entries, entry)
	}
	gateway.WriteJSON(w, http.StatusOK, map[string]any{"services": entries})
}

// connectionStatus tells whether the caller can use svc now: connected,
// needs_sign_in (never connected, or disconnected), expired (the access
// token expired with no refresh token, or the provider rejected the
// refresh), or unavailable (the store cannot be read).
func (h *Handler) connectionStatus(r *http.Request, svc *gateway.Service, caller *gateway.Caller) (string, *gateway.Connection) {
	if svc.Auth.Kind != gateway.AuthBearer && svc.Auth.Kind != gateway.AuthOAuth {
		return statusConnected, nil
	}
	store := h.app.Connections()
	conn, err := store.Load(r.Context(), svc.ID, caller.User)
	switch {
	case errors.Is(err, gateway.ErrNotConnected):
		if svc.Auth.Kind == gateway.AuthOAuth && store.WasRejected(r.Context(), svc.ID, caller.User) {
			return statusExpired, nil
		}
		return statusNeedsSignIn, nil
	case err != nil:
		return statusUnavailable, nil
	case conn.Expired(0) && conn.RefreshToken == "":
		return statusExpired, conn
	}
	return statusConnected, conn
}

// connectable returns the service in the path if the caller may connect it.
func (h *Handler) connectable(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) *gateway.Service {
	svc := h.app.Registry().Lookup(r.PathValue("service"))
	if svc == nil || !svc.AllowsUser(caller.User) {
		gateway.WriteAPIError(w, http.StatusNotFound, "unknown_service", "unknown service "+r.PathValue("service"))
		return nil
	}
	return svc
}

// putConnection: PUT /v1/connections/{service} {"token": "…"} stores a
// personal bearer token, encrypted, for a service with auth bearer.
func (h *Handler) putConnection(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	svc := h.connectable(w, r, caller)
	if svc == nil {
		return
	}
	if svc.Auth.Kind != gateway.AuthBearer {
		msg := "service " + svc.ID + " uses auth " + svc.Auth.Kind + "; only bearer services take a personal token"
		if svc.Auth.Kind == gateway.AuthOAuth {
			msg += "; connect it with POST /v1/connections/" + svc.ID + "/authorize"
		}
		gateway.WriteAPIError(w, http.StatusBadRequest, "wrong_auth_kind", msg)
		return
	}
	var body struct {
		Token string `json:"token"`
	}
	if !readJSON(w, r, &body) {
		return
	}
	if body.Token == "" || len(body.Token) > 8192 || strings.ContainsAny(body.Token, "\r\n") {
		gateway.WriteAPIError(w, http.StatusBadRequest, "invalid_token", `give the token as {"token": "…"}: non-empty, one line, at most 8 KiB`)
		return
	}
	conn := &gateway.Connection{Kind: gateway.AuthBearer, AccessToken: body.Token, TokenType: "Bearer", ConnectedAt: time.Now().UTC()}
	if err := h.app.Connections().Save(r.Context(), svc.ID, caller.User, conn); err != nil {
		h.logger.Error("storing connection", zap.String("service", svc.ID), zap.Error(err))
		gateway.WriteAPIError(w, http.StatusServiceUnavailable, "unavailable", "the credential could not be stored; try again")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// deleteConnection: DELETE /v1/connections/{service} forgets the caller's
// credential for the service.
func (h *Handler) deleteConnection(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	svc := h.connectable(w, r, caller)
	if svc == nil {
		return
	}
	if svc.Auth.Kind != gateway.AuthBearer && svc.Auth.Kind != gateway.AuthOAuth {
		gateway.WriteAPIError(w, http.StatusBadRequest, "wrong_auth_kind", "service "+svc.ID+" has no personal credentials")
		return
	}
	if err := h.app.Connections().Delete(r.Context(), svc.ID, caller.User); err != nil {
		h.logger.Error("deleting connection", zap.String("service", svc.ID), zap.Error(err))
		gateway.WriteAPIError(w, http.StatusServiceUnavailable, "unavailable", "the credential could not be deleted; try again")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
