package api

import (
	"errors"
	"html/template"
	"net/http"
	"strings"

	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/websession"
	"github.com/toolgate/toolgate/modules/gateway"
)

// authorize: POST /v1/connections/{service}/authorize starts connecting an
// oauth service: {"authorize_url": …} is the console's connect page, to be
// opened in a browser signed in to toolgate as the caller. There the person
// confirms, and only that browser sign-in can complete the connect.
func (h *Handler) authorize(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	svc := h.service(w, r, caller)
	if svc == nil {
		return
	}
	if svc.Auth.Kind != gateway.AuthOAuth {
		gateway.WriteAPIError(w, http.StatusBadRequest, "wrong_auth_kind",
			"service "+svc.ID+" uses auth "+svc.Auth.Kind+"; only oauth services are connected through a provider")
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	gateway.WriteJSON(w, http.StatusOK, map[string]string{"authorize_url": h.app.ConnectURL(r, svc, caller.User)})
}

// callback: GET /v1/connections/{service}/callback is where the provider
// sends the person's browser back. It completes the connect only in the
// browser sign-in that started it, and answers with a small HTML page.
func (h *Handler) callback(w http.ResponseWriter, r *http.Request) {
	svc := h.app.Registry().Lookup(r.PathValue("service"))
	if svc == nil || svc.Auth.Kind != gateway.AuthOAuth {
		writePage(w, http.StatusNotFound, page{Title: "Unknown service",
			Message: "There is no service " + approval.VisibleCut(r.PathValue("service"), maxShownName) + " to connect here."})
		return
	}
	name := svc.Title
	if name == "" {
		name = svc.ID
	}
	var browser gateway.Browser
	if bs, err := h.browsers.FromRequest(r, h.secureCookies(r)); err == nil {
		browser = bs.Browser()
	} else if !errors.Is(err, websession.ErrNotSignedIn) {
		writePage(w, http.StatusServiceUnavailable, page{Title: name + " was not connected",
			Message: "toolgate could not read your sign-in because its storage is unavailable. Start connecting again in a moment."})
		return
	}
	q := r.URL.Query()
	state := q.Get("state")
	if code := q.Get("error"); code != "" {
		err := h.app.AbandonAuthorization(r.Context(), svc, state, browser)
		switch {
		case errors.Is(err, gateway.ErrInvalidState):
			writePage(w, http.StatusBadRequest, invalidStatePage(name))
			return
		case errors.Is(err, gateway.ErrOtherBrowser):
			writePage(w, http.StatusForbidden, otherBrowserPage(name))
			return
		}
		p := page{Title: name + " was not connected", Message: providerErrorMessage(code)}
		if d := q.Get("error_description"); d != "" && len(d) <= 300 {
			p.Detail = "The provider said: " + approval.Visible(d) // its text, not toolgate's: nothing hidden or reordered
		}
		writePage(w, http.StatusBadRequest, p)
		return
	}
	code := q.Get("code")
	if state == "" {
		writePage(w, http.StatusBadRequest, invalidStatePage(name))
		return
	}
	if code == "" {
		writePage(w, http.StatusBadRequest, page{Title: name + " was not connected",
			Message: "The provider sent your browser back without an authorization code. Start connecting again."})
		return
	}
	_, err := h.app.CompleteAuthorization(r.Context(), svc, state, code, browser)
	switch {
	case err == nil:
		writePage(w, http.StatusOK, page{Title: name + " is connected",
			Message: "toolgate now holds your " + name + " sign-in and uses it for your calls. You may close this window.",
			Link:    gateway.ConsolePath + "services", LinkText: "Back to your services"})
	case errors.Is(err, gateway.ErrOtherBrowser):
		writePage(w, http.StatusForbidden, otherBrowserPage(name))
	case errors.Is(err, gateway.ErrInvalidState):
		writePage(w, http.StatusBadRequest, invalidStatePage(name))
	case errors.Is(err, gateway.ErrTokenType):
		writePage(w, http.StatusBadGateway, page{Title: name + " was not connected",
			Message: "The provider issued a kind of token toolgate cannot use (it presents bearer tokens only). Nothing was connected. Tell the gateway's administrator."})
	case errors.Is(err, gateway.ErrGrantRejected):
		writePage(w, http.StatusBadRequest, page{Title: name + " was not connected",
			Message: "The provider did not accept the sign-in (" + err.Error() + "). Start connecting again."})
	default:
		writePage(w, http.StatusServiceUnavailable, page{Title: name + " was not connected",
			Message: "toolgate could not finish the sign-in because a service it needs is unavailable. Start connecting again in a moment."})
	}
}

// secureCookies reports whether browser cookies are https-only here.
func (h *Handler) secureCookies(r *http.Request) bool {
	return strings.HasPrefix(h.app.BaseURL(r), "https://")
}

func otherBrowserPage(name string) page {
	return page{Title: name + " was not connected",
		Message: "This connect was started by another toolgate user, or in another browser. Nothing was connected. " +
			"To connect your own account, open the console in this browser, sign in, and choose Connect."}
}

func invalidStatePage(name string) page {
	return page{Title: name + " was not connected",
		Message: "This sign-in link is invalid, has expired or was already used. Start connecting again."}
}

// providerErrorMessage explains an RFC 6749 authorization error code.
func providerErrorMessage(code string) string {
	switch code {
	case "access_denied":
		return "The sign-in was declined (access_denied): nothing was connected."
	case "temporarily_unavailable", "server_error":
		return "The provider could not sign you in right now (" + code + "). Try again in a moment."
	case "invalid_scope":
		return "The provider refused the permissions toolgate asks for (invalid_scope). Tell the gateway's administrator."
	case "unauthorized_client", "invalid_request", "unsupported_response_type":
		return "The provider refused toolgate's request (" + code + "). Tell the gateway's administrator."
	}
	return "The provider answered with an error; nothing was connected."
}

// page is a small HTML answer for a browser.
type page struct {
	Title    string
	Message  string
	Detail   string
	Link     string // a relative link to offer, if any
	LinkText string
}

var pageTemplate = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}} · toolgate</title>
<style>body{font-family:system-ui,sans-serif;max-width:36rem;margin:4rem auto;padding:0 1rem;line-height:1.5;color:#222}h1{font-size:1.4rem}p.detail{color:#666}</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p>{{.Message}}</p>
{{if .Detail}}<p class="detail">{{.Detail}}</p>{{end}}
{{if .Link}}<p><a href="{{.Link}}">{{.LinkText}}</a></p>{{end}}
</body>
</html>
`))

// writePage answers with p. The page loads nothing and sends no Referer
// (the callback URL holds the code and the state).
func writePage(w http.ResponseWriter, status int, p page) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = pageTemplate.Execute(w, p)
}
