package demo

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/toolgate/toolgate/internal/caddyopt"
)

// UnmarshalCaddyfile reads:
//
//	toolgate_demo {
//		client_id             <id>
//		client_secret         <secret>|-
//		redirect_uri          <uri>
//		access_token_lifetime <duration>
//	}
//
// The block is optional; every option takes one argument and may appear
// once.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	return caddyopt.Block(d, "toolgate_demo", func(opt string) error {
		switch opt {
		case "client_id":
			return caddyopt.String(d, &h.ClientID)
		case "client_secret":
			return caddyopt.String(d, &h.ClientSecret)
		case "redirect_uri":
			return caddyopt.String(d, &h.RedirectURI)
		case "access_token_lifetime":
			return caddyopt.Duration(d, &h.AccessTokenLifetime)
		}
		return caddyopt.Unknown(d, "toolgate_demo")
	})
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
