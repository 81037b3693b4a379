package federation

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/toolgate/toolgate/internal/caddyopt"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("toolgate_federation", parseCaddyfile)
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler, written between toolgate_session
// and toolgate_registry in a route that matches the federated path as well
// as the services' (path /v1/mcp /v1/mcp/*):
//
//	toolgate_federation {
//		path      <path>        # default /v1/mcp
//		separator <separator>   # default __
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	return caddyopt.Block(d, "toolgate_federation", func(name string) error {
		switch name {
		case "path":
			return caddyopt.String(d, &h.Path)
		case "separator":
			return caddyopt.String(d, &h.Separator)
		}
		return caddyopt.Unknown(d, "toolgate_federation")
	})
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
