package api

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/toolgate/toolgate/internal/caddyopt"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("toolgate_api", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("toolgate_api", httpcaddyfile.Before, "respond")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler. It takes no options:
//
//	toolgate_api [<matcher>]
//
// It serves /v1/sessions, /v1/catalog, /v1/connections (with the OAuth
// authorize, callback and test routes) and
// /.well-known/oauth-protected-resource, and passes anything else on.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return caddyopt.Bare(d, "it serves the routes README.md lists")
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
