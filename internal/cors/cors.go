// Package cors lets browser-based MCP clients (the MCP Inspector in direct
// mode, a web agent UI) on an allowed origin use the gateway. A browser
// sends a cross-origin request that carries an Authorization header only
// after a preflight (OPTIONS) the server answered for that origin, and lets
// the page read an answer only when it names the page's origin; without
// this, the origins allowed_origins admits could not connect at all.
//
// Which origins are allowed is the gateway's DNS-rebinding rule
// (gateway.App.CheckOrigin: public_url's origin and allowed_origins), and
// the caller of this package checks it first. An allowed origin is named
// exactly, never "*", and no Access-Control-Allow-Credentials is sent: the
// gateway authenticates runners with bearer tokens, never with cookies, so
// a page cannot make a browser spend the person's console sign-in here.
package cors

import (
	"net/http"
	"strings"
)

// MCPMethods are the methods of a Streamable HTTP MCP endpoint.
const MCPMethods = "POST, GET, DELETE"

// maxAge is how long a browser may reuse a preflight's answer (browsers
// cap it lower: Chromium at 2 hours, Firefox at 24).
const maxAge = "600"

// exposed are the response headers a page may read: the MCP session id,
// the negotiated protocol version, and the challenge that points an MCP
// client at the authorization server.
const exposed = "Mcp-Session-Id, Mcp-Protocol-Version, WWW-Authenticate"

// requestHeaders are the request headers a page may send, in lower case;
// Mcp-Param-* (2026-07-28) is allowed by prefix.
var requestHeaders = map[string]bool{
	"authorization": true, "content-type": true, "accept": true,
	"mcp-session-id": true, "mcp-protocol-version": true, "mcp-method": true, "mcp-name": true,
	"last-event-id": true,
}

const paramHeaderPrefix = "mcp-param-"

// IsPreflight reports whether r is a CORS preflight: an OPTIONS request
// with an Origin and the method the browser wants to send.
func IsPreflight(r *http.Request) bool {
	return r.Method == http.MethodOptions && r.Header.Get("Origin") != "" &&
		r.Header.Get("Access-Control-Request-Method") != ""
}

// Preflight answers a preflight from an allowed origin: the methods, and
// those of the requested headers a runner may send — the ones above and
// extra (the toolgate session header, for instance). Headers not allowed
// are left out, so the browser refuses the request itself.
func Preflight(w http.ResponseWriter, r *http.Request, methods string, extra ...string) {
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", r.Header.Get("Origin"))
	h.Set("Access-Control-Allow-Methods", methods)
	if allowed := allowedHeaders(r.Header.Values("Access-Control-Request-Headers"), extra); allowed != "" {
		h.Set("Access-Control-Allow-Headers", allowed)
	}
	h.Set("Access-Control-Max-Age", maxAge)
	h.Add("Vary", "Origin, Access-Control-Request-Method, Access-Control-Request-Headers")
	w.WriteHeader(http.StatusNoContent)
}

// Allow marks the answer to a request from an allowed origin as readable
// by that origin's page, with the headers an MCP client reads. Requests
// without an Origin (not from a browser page) get no CORS headers, but
// every answer says it varies with Origin: a shared cache must not serve
// the answer to a request without one to a page.
func Allow(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Add("Vary", "Origin")
	origin := r.Header.Get("Origin")
	if origin == "" {
		return
	}
	h.Set("Access-Control-Allow-Origin", origin)
	h.Set("Access-Control-Expose-Headers", exposed)
}

// allowedHeaders is the comma-separated list of the requested headers
// that are allowed, in lower case.
func allowedHeaders(requested, extra []string) string {
	var out []string
	for _, line := range requested {
		for name := range strings.SplitSeq(line, ",") {
			name = strings.ToLower(strings.TrimSpace(name))
			if name == "" {
				continue
			}
			ok := requestHeaders[name] || strings.HasPrefix(name, paramHeaderPrefix) && len(name) > len(paramHeaderPrefix)
			for _, e := range extra {
				ok = ok || strings.EqualFold(name, e)
			}
			if ok {
				out = append(out, name)
			}
		}
	}
	return strings.Join(out, ", ")
}
