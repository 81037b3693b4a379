// Package console is toolgate_console: the gateway's pages for people, at
// /console/. People sign in (OpenID Connect, or an API key where the
// operator allows it), connect their accounts to the services they use,
// create toolgate sessions for their runners and copy the client setup,
// and see what the policy decided for them; administrators accept tools
// whose definition changed (package toolpin).
//
// The pages are rendered on the server with html/template from embedded
// files: no build step, no CDN, no inline script, every action a plain
// form that works without JavaScript. They call the same functions as
// toolgate_api (package account), so every rule exists once. Every state
// change needs the session's CSRF token and a same-origin request; every
// answer carries a strict Content-Security-Policy.
package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/activity"
	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/toolpin"
	"github.com/toolgate/toolgate/internal/websession"
	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler serves the console. Requests outside /console/ go to the next
// handler.
type Handler struct {
	// OIDC lists the OpenID Connect issuers people sign in with.
	OIDC []*OIDCIssuer `json:"oidc,omitempty"`

	// APIKeyLogin lets people sign in by pasting one of the API keys of
	// the auth block. Off by default: an API key is a runner's credential,
	// and pasting it into a browser is meant for small setups and the
	// demo.
	APIKeyLogin bool `json:"api_key_login,omitempty"`

	// AdminGroups are the groups whose members see everyone's activity.
	// Default ["admins"].
	AdminGroups []string `json:"admin_groups,omitempty"`

	// SessionIdle ends a browser sign-in unused for this long. Default 1h.
	// A reload that shortens it (or SessionLifetime) ends the sign-ins made
	// before it by the new terms too.
	SessionIdle caddy.Duration `json:"session_idle,omitempty"`

	// SessionLifetime ends a browser sign-in this long after it began,
	// used or not. Default 12h.
	SessionLifetime caddy.Duration `json:"session_lifetime,omitempty"`

	// ActivityRetention is how long decisions stay on the Activity page.
	// Default 168h (7 days). The audit log is not affected.
	ActivityRetention caddy.Duration `json:"activity_retention,omitempty"`

	app       *gateway.App
	approvals *approval.Manager // nil without a cipher
	pins      *toolpin.Pins
	browsers  *websession.Store
	activity  *activity.Log
	ownLog    bool // this handler created the activity log and stops it
	pages     *template.Template
	mux       *http.ServeMux
	logger    *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.toolgate_console",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Defaults.
const (
	defaultSessionIdle       = time.Hour
	defaultSessionLifetime   = 12 * time.Hour
	defaultActivityRetention = 7 * 24 * time.Hour
	maxBrowserSessions       = 20 // per person: signing in once more ends the oldest
	activityObjectsPerUser   = 2000
	minStateSecretBytes      = 32
	maxShownName             = 256 // bytes of a person's name the console shows from a link
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed assets
var assetFiles embed.FS

// Provision finds the toolgate app, prepares the pages and the sign-in.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	app, err := gateway.AppFor(ctx)
	if err != nil {
		return err
	}
	h.app = app
	if len(h.AdminGroups) == 0 {
		h.AdminGroups = []string{"admins"}
	}
	if h.SessionIdle == 0 {
		h.SessionIdle = caddy.Duration(defaultSessionIdle)
	}
	if h.SessionLifetime == 0 {
		h.SessionLifetime = caddy.Duration(defaultSessionLifetime)
	}
	if h.ActivityRetention == 0 {
		h.ActivityRetention = caddy.Duration(defaultActivityRetention)
	}
	for _, o := range h.OIDC {
		if err := o.provision(h.app); err != nil {
			return err
		}
	}
	h.pages, err = parsePages()
	if err != nil {
		return fmt.Errorf("console templates: %v", err)
	}
	if h.browsers, err = websession.For(h.app, maxBrowserSessions); err != nil {
		return err
	}
	// Sign-ins made under an earlier configuration (or on another replica)
	// end by this one's terms: a shortened idle time or lifetime, an
	// issuer no longer configured. (Another console of the configuration
	// with longer terms keeps them: see websession.For.)
	issuers := make([]string, 0, len(h.OIDC))
	for _, o := range h.OIDC {
		issuers = append(issuers, o.Issuer)
	}
	h.browsers.Limit(websession.Limits{Idle: time.Duration(h.SessionIdle), Lifetime: time.Duration(h.SessionLifetime),
		Issuers: issuers, APIKeys: h.APIKeyLogin})
	if h.pins, err = toolpin.For(h.app); err != nil {
		return err
	}
	if h.app.Cipher() != nil {
		if h.approvals, err = approval.For(ctx, h.app); err != nil {
			return err
		}
	}
	log := activity.New(h.app.Storage(), time.Duration(h.ActivityRetention), activityObjectsPerUser, h.logger.Named("activity"))
	if rec := h.app.SetDecisionRecorder(log); rec == gateway.DecisionRecorder(log) {
		h.activity, h.ownLog = log, true
		h.app.OnStart(log.Start)
	} else if shared, ok := rec.(*activity.Log); ok {
		h.activity = shared // another console of this config records
	} else {
		return errors.New("toolgate_console: another decision recorder is configured")
	}
	h.app.RegisterConsole()
	h.app.OnStart(h.housekeeping)
	h.routes()
	return nil
}

// Validate checks the configuration.
func (h *Handler) Validate() error {
	if h.SessionIdle < 0 || h.SessionLifetime < 0 || h.ActivityRetention < 0 {
		return errors.New("toolgate_console: session_idle, session_lifetime and activity_retention must be positive")
	}
	if len(h.OIDC) == 0 && !h.APIKeyLogin {
		return errors.New("toolgate_console: nobody can sign in: configure an oidc issuer (or, for small setups, api_key_login)")
	}
	if len(h.OIDC) > 0 && len(h.app.StateSecret) < minStateSecretBytes {
		return fmt.Errorf("toolgate_console: oidc sign-in needs the toolgate state_secret (at least %d bytes; is its environment variable set?)", minStateSecretBytes)
	}
	seen := map[string]bool{}
	for _, o := range h.OIDC {
		if err := o.validate(); err != nil {
			return err
		}
		if seen[o.Issuer] {
			return fmt.Errorf("toolgate_console: oidc issuer %s given twice", o.Issuer)
		}
		seen[o.Issuer] = true
	}
	return nil
}

// Cleanup writes out the decisions this handler's log still holds.
func (h *Handler) Cleanup() error {
	if h.ownLog {
		h.activity.Stop()
	}
	return nil
}

// housekeeping removes ended browser sessions until the app stops.
func (h *Handler) housekeeping() {
	go func() {
		tick := time.NewTicker(15 * time.Minute)
		defer tick.Stop()
		for {
			select {
			case <-h.app.Done():
				return
			case <-tick.C:
				if n, err := h.browsers.Sweep(context.Background()); err != nil {
					h.logger.Warn("sweeping browser sessions", zap.Error(err))
				} else if n > 0 {
					h.logger.Debug("removed ended browser sessions", zap.Int("count", n))
				}
			}
		}
	}()
}

func (h *Handler) routes() {
	mux := http.NewServeMux()
	p := gateway.ConsolePath
	assets, _ := fs.Sub(assetFiles, "assets")
	mux.Handle("GET "+p+"assets/", http.StripPrefix(p+"assets/", assetServer(assets)))
	mux.HandleFunc("GET "+p+"{$}", h.home)
	mux.HandleFunc("GET "+p+"signin", h.signInPage)
	mux.HandleFunc("POST "+p+"signin", h.apiKeySignIn)
	mux.HandleFunc("GET "+p+"signin/oidc/{issuer}", h.oidcStart)
	mux.HandleFunc("GET "+p+"signin/callback", h.oidcCallback)
	mux.Handle("POST "+p+"signout", h.change(h.signOut))
	mux.Handle("POST "+p+"signout/everywhere", h.change(h.signOutEverywhere))
	mux.Handle("GET "+p+"services", h.signedIn(h.servicesPage))
	mux.Handle("POST "+p+"services/{service}/test", h.change(h.testService))
	mux.Handle("POST "+p+"services/{service}/disconnect", h.change(h.disconnect))
	mux.Handle("POST "+p+"services/{service}/token", h.change(h.storeToken))
	mux.Handle("GET "+p+"connect/{service}", h.signedIn(h.connectPage))
	mux.Handle("POST "+p+"connect/{service}", h.change(h.connect))
	mux.Handle("GET "+p+"sessions", h.signedIn(h.sessionsPage))
	mux.Handle("POST "+p+"sessions", h.change(h.createSession))
	mux.Handle("POST "+p+"sessions/{ref}/end", h.change(h.endSession))
	mux.Handle("GET "+p+"activity", h.signedIn(h.activityPage))
	mux.Handle("GET "+p+"approvals", h.signedIn(h.approvalsPage))
	mux.Handle("POST "+p+"approvals", h.change(h.bulk))
	mux.Handle("GET "+p+"approvals/{id}", h.signedIn(h.approvalPage))
	mux.Handle("POST "+p+"approvals/{id}/approve", h.change(h.decide(true)))
	mux.Handle("POST "+p+"approvals/{id}/deny", h.change(h.decide(false)))
	mux.Handle("GET "+p+"tools", h.signedIn(h.toolsPage))
	mux.Handle("POST "+p+"tools/accept", h.change(h.acceptTool))
	h.mux = mux
}

// ServeHTTP serves a console page, or passes the request on.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if r.URL.Path != strings.TrimSuffix(gateway.ConsolePath, "/") && !strings.HasPrefix(r.URL.Path, gateway.ConsolePath) {
		return next.ServeHTTP(w, r)
	}
	securityHeaders(w.Header())
	if gateway.InEarlyData(r) {
		h.refuse(w, r, http.StatusTooEarly, "Too early", "This request was sent in TLS early data, which can be replayed, so nothing was changed. Send it again.")
		return nil
	}
	if !h.app.CheckOrigin(r) {
		h.refuse(w, r, http.StatusForbidden, "Refused", "This request came from a page toolgate does not trust (its Origin or Host is not allowed), so nothing was changed.")
		return nil
	}
	if h.isAsset(r) {
		// Embedded files, which need nothing Start sets up: the page
		// below is laid out with them too.
		h.mux.ServeHTTP(w, r)
		return nil
	}
	if !h.app.Started(r.Context()) {
		w.Header().Set("Retry-After", "1")
		// Not refuse: who is signed in is not known before Start.
		h.render(w, http.StatusServiceUnavailable, "message", view{Title: "Starting",
			Notice: &notice{Kind: "warn", Text: "toolgate is starting. Reload this page in a moment."}})
		return nil
	}
	if _, pattern := h.mux.Handler(r); pattern == "" {
		if r.URL.Path == strings.TrimSuffix(gateway.ConsolePath, "/") {
			http.Redirect(w, r, gateway.ConsolePath, http.StatusFound)
			return nil
		}
		h.refuse(w, r, http.StatusNotFound, "Not found", "There is no such page in the console.")
		return nil
	}
	h.mux.ServeHTTP(w, r)
	return nil
}

// securityHeaders are sent with every console answer. Scripts and styles
// come only from the console's own files; no page may be framed.
func securityHeaders(hd http.Header) {
	hd.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	hd.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=()")
}

// isAsset reports whether r reads one of the embedded files: a GET or
// HEAD the assets route takes, not of the directory. Anything else under
// the prefix goes the way of every page.
func (h *Handler) isAsset(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead ||
		!strings.HasPrefix(r.URL.Path, gateway.ConsolePath+"assets/") || strings.HasSuffix(r.URL.Path, "/") {
		return false
	}
	_, pattern := h.mux.Handler(r)
	return pattern == "GET "+gateway.ConsolePath+"assets/"
}

// assetServer serves the embedded stylesheet and script, cacheable.
func assetServer(files fs.FS) http.Handler {
	fileServer := http.FileServerFS(files)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" || strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // a directory: the files are named in the pages
			return
		}
		w.Header().Set("Cache-Control", "public, max-age=3600")
		fileServer.ServeHTTP(w, r)
	})
}

// secure reports whether cookies are https-only here.
func (h *Handler) secure(r *http.Request) bool {
	return strings.HasPrefix(h.app.BaseURL(r), "https://")
}

type signedInHandler func(http.ResponseWriter, *http.Request, *websession.Session)

// signedIn wraps a page for signed-in people; others are sent to sign in
// and brought back.
func (h *Handler) signedIn(next signedInHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := h.browsers.FromRequest(r, h.secure(r))
		if errors.Is(err, websession.ErrNotSignedIn) {
			http.Redirect(w, r, gateway.ConsolePath+"signin?"+url.Values{"return": {r.URL.RequestURI()}}.Encode(), http.StatusSeeOther)
			return
		}
		if err != nil {
			h.logger.Error("reading a browser session", zap.Error(err))
			h.refuse(w, r, http.StatusServiceUnavailable, "Unavailable", "toolgate cannot read your sign-in right now (its storage is unavailable). Try again in a moment.")
			return
		}
		next(w, r, s)
	})
}

// change wraps a state-changing form: it needs a signed-in person, a
// same-origin request and the session's CSRF token.
func (h *Handler) change(next signedInHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.sameOrigin(r) {
			h.refuse(w, r, http.StatusForbidden, "Refused", "This form was not sent from a toolgate page, so nothing was changed.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		s, err := h.browsers.FromRequest(r, h.secure(r))
		if err != nil {
			if errors.Is(err, websession.ErrNotSignedIn) {
				h.refuse(w, r, http.StatusForbidden, "Signed out", "Your sign-in ended, so nothing was changed. Sign in again and repeat what you did.")
				return
			}
			h.logger.Error("reading a browser session", zap.Error(err))
			h.refuse(w, r, http.StatusServiceUnavailable, "Unavailable", "toolgate cannot read your sign-in right now (its storage is unavailable). Try again in a moment.")
			return
		}
		if !s.CheckCSRF(r.PostFormValue("csrf")) {
			h.refuse(w, r, http.StatusForbidden, "Refused", "This form is stale or was not sent from your toolgate page, so nothing was changed. Reload the page and try again.")
			return
		}
		next(w, r, s)
	})
}

const maxFormBytes = 64 << 10

// sameOrigin reports whether a POST came from a page of this gateway: its
// Origin is the gateway's own, or (for browsers that send no Origin) the
// browser says the request is same-origin. Anything else is refused.
func (h *Handler) sameOrigin(r *http.Request) bool {
	if origin := r.Header.Get("Origin"); origin != "" {
		return h.app.OwnOrigin(r, origin)
	}
	return r.Header.Get("Sec-Fetch-Site") == "same-origin"
}

// home sends people to their services, or to sign in.
func (h *Handler) home(w http.ResponseWriter, r *http.Request) {
	if _, err := h.browsers.FromRequest(r, h.secure(r)); err == nil {
		http.Redirect(w, r, gateway.ConsolePath+"services", http.StatusFound)
		return
	}
	http.Redirect(w, r, gateway.ConsolePath+"signin", http.StatusFound)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
