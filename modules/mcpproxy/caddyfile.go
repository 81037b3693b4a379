package mcpproxy

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/toolgate/toolgate/internal/caddyopt"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("toolgate_proxy", parseCaddyfile)
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler. It takes no options: upstream URLs
// and timeouts come from the registry in the toolgate global option.
//
//	toolgate_proxy
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return caddyopt.Bare(d, "services are defined in the toolgate global option")
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
