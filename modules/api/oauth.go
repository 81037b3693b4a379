package api

import (
	"errors"
	"html/template"
	"net/http"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/gateway"
)

// authorize: POST /v1/connections/{service}/authorize starts connecting an
// oauth service: {"authorize_url": …} is the provider's authorization URL,
// with PKCE S256, the RFC 8707 resource and a state signed for this caller
// and service, valid once for 10 minutes. The user opens it in a browser.
func (h *Handler) authorize(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	svc := h.connectable(w, r, caller)
	if svc == nil {
		return
	}
	if svc.Auth.Kind != gateway.AuthOAuth {
		gateway.WriteAPIError(w, http.StatusBadRequest, "wrong_auth_kind",
			"service "+svc.ID+" uses auth "+svc.Auth.Kind+"; only oauth services are connected through a provider")
		return
	}
	u, err := h.app.AuthorizeURL(r.Context(), svc, caller.User)
	if err != nil {
		h.logger.Error("starting an oauth sign-in", zap.String("service", svc.ID), zap.Error(err))
		gateway.WriteAPIError(w, http.StatusServiceUnavailable, "unavailable", "the sign-in could not be started; try again")
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	gateway.WriteJSON(w, http.StatusOK, map[string]string{"authorize_url": u})
}

// callback: GET /v1/connections/{service}/callback is where the provider
// sends the user's browser back. It answers with a small HTML page.
func (h *Handler) callback(w http.ResponseWriter, r *http.Request) {
	svc := h.app.Registry().Lookup(r.PathValue("service"))
	if svc == nil || svc.Auth.Kind != gateway.AuthOAuth {
		writePage(w, http.StatusNotFound, page{Title: "Unknown service",
			Message: "There is no service " + r.PathValue("service") + " to connect here."})
		return
	}
	name := svc.Title
	if name == "" {
		name = svc.ID
	}
	q := r.URL.Query()
	state := q.Get("state")
	if code := q.Get("error"); code != "" {
		err := h.app.AbandonAuthorization(r.Context(), svc, state)
		if errors.Is(err, gateway.ErrInvalidState) {
			writePage(w, http.StatusBadRequest, invalidStatePage(name))
			return
		}
		p := page{Title: name + " was not connected", Message: providerErrorMessage(code)}
		if d := q.Get("error_description"); d != "" && len(d) <= 300 {
			p.Detail = "The provider said: " + d
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
	_, err := h.app.CompleteAuthorization(r.Context(), svc, state, code)
	switch {
	case err == nil:
		writePage(w, http.StatusOK, page{Title: name + " is connected",
			Message: "toolgate now holds your " + name + " sign-in and uses it for your calls. You may close this window."})
	case errors.Is(err, gateway.ErrInvalidState):
		writePage(w, http.StatusBadRequest, invalidStatePage(name))
	case errors.Is(err, gateway.ErrGrantRejected):
		writePage(w, http.StatusBadRequest, page{Title: name + " was not connected",
			Message: "The provider did not accept the sign-in (" + err.Error() + "). Start connecting again."})
	default:
		writePage(w, http.StatusServiceUnavailable, page{Title: name + " was not connected",
			Message: "toolgate could not finish the sign-in because a service it needs is unavailable. Start connecting again in a moment."})
	}
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
	Title   string
	Message string
	Detail  string
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
