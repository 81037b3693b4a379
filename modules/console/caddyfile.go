package console

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/toolgate/toolgate/internal/caddyopt"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("toolgate_console", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("toolgate_console", httpcaddyfile.Before, "respond")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	c := new(Handler)
	err := c.UnmarshalCaddyfile(h.Dispenser)
	return c, err
}

// UnmarshalCaddyfile sets up the console. It serves /console/ and passes
// every other request on:
//
//	toolgate_console {
//		oidc <issuer url> {
//			client_id     <id>
//			client_secret <secret>
//			scopes        <scope...>
//			user_claim    <claim>
//			groups_claim  <claim>
//			name          <button label>
//		}
//		api_key_login
//		admin_groups       <group...>
//		session_idle       <duration>
//		session_lifetime   <duration>
//		activity_retention <duration>
//	}
//
// oidc may be repeated, one block per issuer; every other option may appear
// once.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.ArgErr()
	}
	return caddyopt.Block(d, "toolgate_console", func(opt string) error {
		switch opt {
		case "oidc":
			o := new(OIDCIssuer)
			if !d.NextArg() {
				return d.ArgErr()
			}
			o.Issuer = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
			if err := caddyopt.Block(d, "oidc", func(sub string) error {
				switch sub {
				case "client_id":
					return caddyopt.String(d, &o.ClientID)
				case "client_secret":
					return caddyopt.String(d, &o.ClientSecret)
				case "scopes":
					o.Scopes = d.RemainingArgs()
					if len(o.Scopes) == 0 {
						return d.ArgErr()
					}
				case "user_claim":
					return caddyopt.String(d, &o.UserClaim)
				case "groups_claim":
					return caddyopt.String(d, &o.GroupsClaim)
				case "name":
					return caddyopt.String(d, &o.Name)
				default:
					return caddyopt.Unknown(d, "oidc")
				}
				return nil
			}); err != nil {
				return err
			}
			if o.ClientID == "" {
				return d.Errf("oidc %s: client_id is required", o.Issuer)
			}
			h.OIDC = append(h.OIDC, o)
		case "api_key_login":
			h.APIKeyLogin = true
			return caddyopt.NoArgs(d)
		case "admin_groups":
			h.AdminGroups = d.RemainingArgs()
			if len(h.AdminGroups) == 0 {
				return d.ArgErr()
			}
		case "session_idle":
			return caddyopt.Duration(d, &h.SessionIdle)
		case "session_lifetime":
			return caddyopt.Duration(d, &h.SessionLifetime)
		case "activity_retention":
			return caddyopt.Duration(d, &h.ActivityRetention)
		default:
			return caddyopt.Unknown(d, "toolgate_console")
		}
		return nil
	}, "oidc")
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
