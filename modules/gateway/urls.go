package gateway

import (
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Where the gateway is, as the requests it takes see it: the origins it
// answers browsers from, and the URLs it tells runners and people.

// CheckOrigin is the gateway's DNS-rebinding protection. It reports
// whether a request's Origin header, when present, is allowed (public_url's
// origin, or without public_url the request's own: OwnOrigin; or
// allowed_origins), and whether a request that arrived on a loopback
// address names a loopback host or public_url's host — a browser tricked
// into sending a request to a local gateway names another host.
func (a *App) CheckOrigin(r *http.Request) bool {
	if origin := r.Header.Get("Origin"); origin != "" {
		if _, ok := a.origins[origin]; !ok && !a.OwnOrigin(r, origin) {
			return false
		}
	}
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if local == nil || !isLoopback(local.String()) {
		return true
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" || host == a.publicHost {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// OwnOrigin reports whether origin is the gateway's own for r: public_url's
// origin (as browsers spell it), or without public_url the request's Host
// under https when it is a name — one TLS vouches for, which a page
// rebinding another name to the gateway cannot present, even where a proxy
// in front terminates it — and when it is an IP address or localhost,
// which no DNS answer rebinds, under the connection's own scheme. A plain-http gateway reached by a name needs public_url (or
// allowed_origins) for browsers to post to it.
func (a *App) OwnOrigin(r *http.Request, origin string) bool {
	if a.PublicURL != "" {
		return origin == a.publicOrigin // as browsers send it: lower case
	}
	scheme, host, ok := strings.Cut(origin, "://")
	if !ok || host == "" || !strings.EqualFold(host, r.Host) {
		return false
	}
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.Trim(name, "[]")
	// An address or localhost: no certificate vouches for it, and a page
	// of it on another port (https's 443 against http's 80, both
	// unwritten) is another origin: the scheme must be the connection's.
	address := strings.EqualFold(name, "localhost") || net.ParseIP(name) != nil
	switch scheme {
	case "https":
		return !address || r.TLS != nil
	case "http":
		return address && r.TLS == nil
	}
	return false
}

// browserOrigin is u's origin as browsers send it in Origin: lower-case
// scheme and host, without the scheme's default port.
func browserOrigin(u *url.URL) string {
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if scheme == "https" && port == "443" || scheme == "http" && port == "80" {
		port = ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port != "" {
		host += ":" + port
	}
	return scheme + "://" + host
}

// BaseURL is PublicURL, or the URL the request arrived at.
func (a *App) BaseURL(r *http.Request) string {
	if a.PublicURL != "" {
		return a.PublicURL
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// ResourceMetadataURL is the RFC 9728 metadata URL for WWW-Authenticate.
func (a *App) ResourceMetadataURL(r *http.Request) string {
	return a.BaseURL(r) + "/.well-known/oauth-protected-resource"
}

// NeedsSignIn is the error data telling a runner where its user connects
// svc, for the caller of the call r carries. See [App.NeedsSignInFor].
func (a *App) NeedsSignIn(r *http.Request, svc *Service) map[string]any {
	user := ""
	if c := CallFrom(r); c != nil && c.Caller != nil {
		user = c.Caller.User
	}
	return a.NeedsSignInFor(r, svc, user)
}

// NeedsSignInFor is the error data telling a runner where user connects
// svc: connect_url (see [App.ConnectURL]), to open in a browser; when no
// console serves the gateway, a bearer service's connect_url is the API
// endpoint a personal token is PUT to (connect_method PUT). Building it
// stores nothing.
func (a *App) NeedsSignInFor(r *http.Request, svc *Service, user string) map[string]any {
	data := map[string]any{"needs_sign_in": true, "service": svc.ID, "connect_url": a.ConnectURL(r, svc, user)}
	if !a.console {
		data["connect_method"] = "PUT"
	}
	return data
}

// ConnectHint is where and how to connect, as the message of a
// needs_sign_in error says it (data is NeedsSignInFor's): many clients show
// a JSON-RPC error's message only, not its data.
func ConnectHint(data map[string]any) string {
	u, _ := data["connect_url"].(string)
	if data["connect_method"] == "PUT" {
		return "(PUT your token to " + u + ")"
	}
	return "at " + u
}

// ConnectURL is where user connects svc: the console's connect page, which
// a browser signed in to toolgate as user opens (a browser signed in as
// someone else is refused, and one not signed in is asked to sign in
// first). Without a console it is the API endpoint a bearer service's
// personal token is PUT to.
func (a *App) ConnectURL(r *http.Request, svc *Service, user string) string {
	if !a.console {
		return a.BaseURL(r) + "/v1/connections/" + url.PathEscape(svc.ID)
	}
	u := a.BaseURL(r) + ConsolePath + "connect/" + url.PathEscape(svc.ID)
	if user != "" {
		u += "?" + url.Values{"for": {user}}.Encode()
	}
	return u
}

// ConsolePath is where toolgate_console serves its pages.
const ConsolePath = "/console/"

func isLoopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
