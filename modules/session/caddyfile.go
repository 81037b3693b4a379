package session

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/toolgate/toolgate/internal/caddyopt"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("toolgate_session", parseCaddyfile)
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler. It takes no options; what it
// checks is configured in the toolgate global option (auth, session_header,
// allowed_origins):
//
//	toolgate_session
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return caddyopt.Bare(d, "configure auth in the toolgate global option")
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
