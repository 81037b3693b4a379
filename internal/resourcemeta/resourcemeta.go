// Package resourcemeta is how an MCP client learns where to get a token for
// toolgate (the MCP authorization spec, RFC 9728): the protected-resource
// metadata documents and the WWW-Authenticate challenge that points at
// them. An unmodified client that is given only an endpoint's URL gets a
// 401 whose challenge names the endpoint's metadata; the metadata lists the
// authorization servers (the issuers of the auth block's jwt entries) and
// the scopes to ask for; the client gets a token there (authorization code
// with PKCE, the endpoint as resource) and calls again with it.
//
// Every MCP endpoint is a resource of its own, identified by its URL
// (https://gateway.example.com/v1/mcp/tracker): its metadata is at the
// well-known path with the endpoint's path appended, and its resource is
// that URL exactly, as clients check (RFC 9728, section 3.3). The gateway
// as a whole is the resource of the root document.
package resourcemeta

import (
	"errors"
	"net/http"
	"strings"

	"github.com/toolgate/toolgate/modules/gateway"
)

// WellKnown is the path of the root metadata document; an endpoint's is
// this path followed by the endpoint's path.
const WellKnown = "/.well-known/oauth-protected-resource"

// resourceName is shown by clients that display the resource.
const resourceName = "toolgate MCP gateway"

// Document is the metadata of the resource at path on the gateway ("" for
// the gateway itself).
func Document(app *gateway.App, r *http.Request, path string) map[string]any {
	meta := map[string]any{
		"resource":                 app.BaseURL(r) + path,
		"bearer_methods_supported": []string{"header"},
		"resource_name":            resourceName,
	}
	var servers []string
	for _, j := range app.Auth.JWT {
		servers = append(servers, j.Issuer)
	}
	if len(servers) > 0 {
		meta["authorization_servers"] = servers
	}
	if len(app.Auth.Scopes) > 0 {
		meta["scopes_supported"] = app.Auth.Scopes
	}
	return meta
}

// Challenge is the WWW-Authenticate value of a 401 for a request to the
// resource at path ("" for the gateway itself): where its metadata is,
// the scopes to ask for, and, when a token was sent (err is not
// gateway.ErrNoCredentials), that it was refused.
func Challenge(app *gateway.App, r *http.Request, path string, err error) string {
	var b strings.Builder
	b.WriteString(`Bearer resource_metadata="`)
	b.WriteString(app.BaseURL(r) + WellKnown + path)
	b.WriteByte('"')
	if len(app.Auth.Scopes) > 0 {
		b.WriteString(`, scope="`)
		b.WriteString(strings.Join(app.Auth.Scopes, " "))
		b.WriteByte('"')
	}
	if !errors.Is(err, gateway.ErrNoCredentials) {
		b.WriteString(`, error="invalid_token"`)
	}
	return b.String()
}

// EndpointPath is the resource path of r's endpoint: its URL path as sent
// (escaped), without a trailing slash.
func EndpointPath(r *http.Request) string { return strings.TrimSuffix(r.URL.EscapedPath(), "/") }

// DocumentPath is the resource path a request for a metadata document
// names: what follows the well-known path ("" for the root document), or
// false when r is not for a metadata document.
func DocumentPath(r *http.Request) (string, bool) {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), WellKnown)
	if !ok || rest != "" && rest[0] != '/' {
		return "", false
	}
	return strings.TrimSuffix(rest, "/"), true
}
