// Package account is what a person — or a runner acting for them — does
// with their own toolgate account: their toolgate sessions, the catalog of
// the services they may use, and their connections (stored credentials) to
// those services. toolgate_api answers it as JSON and toolgate_console as
// pages; both call these functions, so every rule exists once.
//
// Every function acts for one caller and refuses what that caller may not
// do with an *Error, whose message says what to do.
package account

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/toolgate/toolgate/modules/gateway"
)

// Error is a refusal the person can act on. Status is the HTTP status an
// API answers with, Code a stable word for programs, Message a sentence for
// people.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

func refuse(status int, code, message string) *Error {
	return &Error{Status: status, Code: code, Message: message}
}

// Unavailable is the refusal for a store, cipher or provider that failed:
// worth retrying.
func Unavailable(what string) *Error {
	return refuse(http.StatusServiceUnavailable, "unavailable", what+"; try again in a moment")
}

// Service returns the service id names if caller may use it.
func Service(app *gateway.App, caller *gateway.Caller, id string) (*gateway.Service, error) {
	svc := app.Registry().Lookup(id)
	if svc == nil || !svc.AllowsUser(caller.User) {
		return nil, refuse(http.StatusNotFound, "unknown_service", "unknown service "+id)
	}
	return svc, nil
}

// ServiceToForget returns the service id names for caller to forget their
// own credential for: as Service, and also a service a reload took them
// off (allowed_users) while toolgate still holds a credential of theirs
// for it, which stays theirs to forget and revoke.
func ServiceToForget(ctx context.Context, app *gateway.App, caller *gateway.Caller, id string) (*gateway.Service, error) {
	svc, err := Service(app, caller, id)
	if err == nil {
		return svc, nil
	}
	barred := app.Registry().Lookup(id)
	if barred == nil || !app.Connections().Storage().Exists(ctx, gateway.ConnectionKey(id, caller.User)) {
		return nil, err
	}
	return barred, nil
}

// Services returns the services caller may use, in registry order.
func Services(app *gateway.App, caller *gateway.Caller) []*gateway.Service {
	var out []*gateway.Service
	for _, svc := range app.Registry().Services() {
		if svc.AllowsUser(caller.User) {
			out = append(out, svc)
		}
	}
	return out
}

// CreateSession starts a toolgate session for caller that selects
// services. Unknown or disallowed services fail before anything is stored.
func CreateSession(ctx context.Context, app *gateway.App, caller *gateway.Caller, services []string) (*gateway.Session, error) {
	if len(services) == 0 {
		return nil, refuse(http.StatusBadRequest, "invalid_body", `choose the services the session may use: {"services": ["…"]}`)
	}
	seen := map[string]bool{}
	ids := make([]string, 0, len(services))
	for _, id := range services {
		if _, err := Service(app, caller, id); err != nil {
			return nil, err
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	sess, err := app.Sessions().Create(ctx, caller.User, ids)
	switch {
	case errors.Is(err, gateway.ErrTooManySessions):
		return nil, refuse(http.StatusTooManyRequests, "too_many_sessions", err.Error())
	case err != nil:
		app.Logger().Error("creating session", zapError(err)...)
		return nil, Unavailable("the session could not be stored")
	}
	return sess, nil
}

// OwnSession returns the session with id if it is caller's.
func OwnSession(ctx context.Context, app *gateway.App, caller *gateway.Caller, id string) (*gateway.Session, error) {
	sess, err := app.Sessions().Get(ctx, id)
	switch {
	case errors.Is(err, gateway.ErrSessionNotFound):
		return nil, refuse(http.StatusNotFound, "session_not_found", "session not found or expired")
	case err != nil:
		app.Logger().Error("reading session", zapError(err)...)
		return nil, Unavailable("the session could not be read")
	case sess.User != caller.User:
		return nil, refuse(http.StatusForbidden, "forbidden", "this session belongs to another caller")
	}
	return sess, nil
}

// Sessions lists caller's live sessions, newest first (never their ids).
func Sessions(ctx context.Context, app *gateway.App, caller *gateway.Caller) ([]gateway.SessionSummary, error) {
	list, err := app.Sessions().List(ctx, caller.User)
	if err != nil {
		app.Logger().Error("listing sessions", zapError(err)...)
		return nil, Unavailable("your sessions could not be read")
	}
	return list, nil
}

// OwnSessionRef checks that ref (gateway.SessionSummary.Ref) names one of
// caller's live sessions.
func OwnSessionRef(ctx context.Context, app *gateway.App, caller *gateway.Caller, ref string) error {
	list, err := Sessions(ctx, app, caller)
	if err != nil {
		return err
	}
	for _, s := range list {
		if s.Ref == ref {
			return nil
		}
	}
	return refuse(http.StatusNotFound, "session_not_found", "none of your live sessions has this ref")
}

// EndSession ends caller's session named by ref (gateway.SessionSummary.Ref).
func EndSession(ctx context.Context, app *gateway.App, caller *gateway.Caller, ref string) error {
	if err := app.Sessions().DeleteRef(ctx, caller.User, ref); err != nil {
		app.Logger().Error("deleting session", zapError(err)...)
		return Unavailable("the session could not be ended")
	}
	return nil
}

// Connection statuses.
const (
	StatusConnected   = "connected"
	StatusNeedsSignIn = "needs_sign_in"
	StatusExpired     = "expired"
	StatusUnavailable = "unavailable"
)

// Entry is one service of the catalog: never its URL or a credential.
type Entry struct {
	ID         string          `json:"id"`
	Title      string          `json:"title,omitempty"`
	Auth       string          `json:"auth"`
	Status     string          `json:"status"`
	Tools      []string        `json:"tools"`
	Connection *ConnectionView `json:"connection,omitempty"`
}

// Name is the service's title, or its id.
func (e Entry) Name() string {
	if e.Title != "" {
		return e.Title
	}
	return e.ID
}

// Personal reports whether the service uses a credential of the person's
// own (a personal token or an OAuth grant).
func (e Entry) Personal() bool { return e.Auth == gateway.AuthBearer || e.Auth == gateway.AuthOAuth }

// ConnectionView is what the catalog tells about a stored credential.
type ConnectionView struct {
	ConnectedAt  time.Time `json:"connected_at"`
	ExpiresAt    time.Time `json:"expires_at,omitzero"`
	Scopes       []string  `json:"scopes,omitempty"`
	RefreshCount int       `json:"refresh_count"`
	RefreshedAt  time.Time `json:"refreshed_at,omitzero"`
}

// Catalog lists the services caller may use, with the status of their
// connection to each.
func Catalog(ctx context.Context, app *gateway.App, caller *gateway.Caller) []Entry {
	entries := []Entry{}
	for _, svc := range Services(app, caller) {
		entries = append(entries, CatalogEntry(ctx, app, caller, svc))
	}
	return entries
}

// CatalogEntry is svc's entry of caller's catalog.
func CatalogEntry(ctx context.Context, app *gateway.App, caller *gateway.Caller, svc *gateway.Service) Entry {
	status, conn := connectionStatus(ctx, app, svc, caller)
	e := Entry{ID: svc.ID, Title: svc.Title, Auth: svc.Auth.Kind, Status: status, Tools: svc.Tools}
	if conn != nil {
		e.Connection = &ConnectionView{ConnectedAt: conn.ConnectedAt, ExpiresAt: conn.Expiry, Scopes: conn.Scopes,
			RefreshCount: conn.RefreshCount, RefreshedAt: conn.RefreshedAt}
	}
	return e
}

// connectionStatus tells whether caller can use svc now: connected,
// needs_sign_in (never connected, disconnected, or sealed with a cipher key
// replaced since: gateway.ErrSealedWithOtherKey), expired (the access
// token expired with no refresh token, or the provider rejected the
// refresh), or unavailable (the store cannot be read).
func connectionStatus(ctx context.Context, app *gateway.App, svc *gateway.Service, caller *gateway.Caller) (string, *gateway.Connection) {
	if svc.Auth.Kind != gateway.AuthBearer && svc.Auth.Kind != gateway.AuthOAuth {
		return StatusConnected, nil
	}
	store := app.Connections()
	conn, err := store.Load(ctx, svc.ID, caller.User)
	switch {
	case errors.Is(err, gateway.ErrNotConnected):
		if svc.Auth.Kind == gateway.AuthOAuth && store.WasRejected(ctx, svc.ID, caller.User) {
			return StatusExpired, nil
		}
		return StatusNeedsSignIn, nil
	case errors.Is(err, gateway.ErrSealedWithOtherKey):
		return StatusNeedsSignIn, nil
	case err != nil:
		return StatusUnavailable, nil
	case !conn.UsableFor(svc):
		return StatusNeedsSignIn, nil // of another kind or provider: never sent (gateway.ErrGrantElsewhere)
	case conn.Expired(0) && conn.RefreshToken == "":
		return StatusExpired, conn
	}
	return StatusConnected, conn
}

// MaxTokenBytes bounds a personal token.
const MaxTokenBytes = 8192

// StoreToken stores caller's personal token for svc (a service with auth
// bearer), encrypted.
func StoreToken(ctx context.Context, app *gateway.App, caller *gateway.Caller, svc *gateway.Service, token string) error {
	if svc.Auth.Kind != gateway.AuthBearer {
		msg := "service " + svc.ID + " uses auth " + svc.Auth.Kind + "; only bearer services take a personal token"
		if svc.Auth.Kind == gateway.AuthOAuth {
			msg += "; connect it through its provider instead"
		}
		return refuse(http.StatusBadRequest, "wrong_auth_kind", msg)
	}
	if msg := tokenProblem(token); msg != "" {
		return refuse(http.StatusBadRequest, "invalid_token", msg)
	}
	conn := &gateway.Connection{Kind: gateway.AuthBearer, AccessToken: token, TokenType: "Bearer", ConnectedAt: time.Now().UTC()}
	if err := app.Connect(ctx, svc.ID, caller.User, conn); err != nil {
		app.Logger().Error("storing connection", zapService(svc, err)...)
		return Unavailable("the credential could not be stored")
	}
	return nil
}

// tokenProblem says what keeps token from being sent as a bearer token,
// "" when nothing does. toolgate sends it as "Authorization: Bearer
// <token>", where it is a run of visible ASCII characters: anything else
// could never work (a control character fails every request, unsent), so
// it is refused when stored rather than at each call.
func tokenProblem(token string) string {
	switch {
	case token == "" || len(token) > MaxTokenBytes:
		return "give the token: non-empty, at most 8 KiB"
	case len(token) > 7 && strings.EqualFold(token[:7], "bearer "):
		return "give the token alone, without \"Bearer \": toolgate sends it as Authorization: Bearer <token>"
	}
	for i := 0; i < len(token); i++ {
		if c := token[i]; c <= ' ' || c >= 0x7f {
			return "the token holds a space, a line break or another control character, or a character outside ASCII, at byte " + strconv.Itoa(i) +
				": a bearer token is one line of visible ASCII characters (check what was copied)"
		}
	}
	return ""
}

// Disconnect forgets caller's credential for svc and, when svc's OAuth
// provider has a revocation endpoint, revokes the grant there. notRevoked,
// when not empty, tells the person that the provider did not confirm the
// revocation and what to do; the credential is forgotten all the same.
func Disconnect(ctx context.Context, app *gateway.App, caller *gateway.Caller, svc *gateway.Service) (notRevoked string, err error) {
	if svc.Auth.Kind != gateway.AuthBearer && svc.Auth.Kind != gateway.AuthOAuth {
		return "", refuse(http.StatusBadRequest, "wrong_auth_kind", "service "+svc.ID+" has no personal credentials")
	}
	err = app.Disconnect(ctx, svc, caller.User)
	if errors.Is(err, gateway.ErrNotRevoked) {
		msg := err.Error()
		return strings.ToUpper(msg[:1]) + msg[1:] + ": revoke toolgate's access in your account at the provider.", nil
	}
	if err != nil {
		app.Logger().Error("deleting connection", zapService(svc, err)...)
		return "", Unavailable("the credential could not be deleted")
	}
	return "", nil
}
