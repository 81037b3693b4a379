package demo

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
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
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return d.Errf("toolgate_demo: %s given twice", opt)
		}
		seen[opt] = true
		if !d.NextArg() {
			return d.ArgErr()
		}
		val := d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
		switch opt {
		case "client_id":
			h.ClientID = val
		case "client_secret":
			h.ClientSecret = val
		case "redirect_uri":
			h.RedirectURI = val
		case "access_token_lifetime":
			dur, err := caddy.ParseDuration(val)
			if err != nil || dur <= 0 {
				return d.Errf("toolgate_demo: access_token_lifetime: invalid duration %q", val)
			}
			h.AccessTokenLifetime = caddy.Duration(time.Duration(dur))
		default:
			return d.Errf("toolgate_demo: unknown option %q", opt)
		}
	}
	return nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
