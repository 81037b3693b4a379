package vaulttransit

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/toolgate/toolgate/internal/caddyopt"
)

// UnmarshalCaddyfile sets up the cipher from Caddyfile tokens. The dispenser
// starts at the module name, as caddyfile.UnmarshalModule leaves it:
//
//	vault_transit {
//		address   <url>
//		token     <token>
//		approle {
//			role_id   <role_id>
//			secret_id <secret_id>
//			mount     <path>
//		}
//		namespace <namespace>
//		mount     <path>
//		key       <name>
//		timeout   <duration>
//		tls {
//			ca_file     <path>
//			server_name <name>
//		}
//	}
//
// Every sub-option takes exactly one argument except approle and tls, which
// take a block. Options may appear at most once. Placeholders are kept as
// written and expanded at Provision.
func (c *Cipher) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if !d.Next() { // consume the module name
		return d.Err("expected tokens")
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	return caddyopt.Block(d, "vault_transit", func(opt string) error {
		switch opt {
		case "address":
			return caddyopt.String(d, &c.Address)
		case "token":
			return caddyopt.String(d, &c.Token)
		case "namespace":
			return caddyopt.String(d, &c.Namespace)
		case "mount":
			return caddyopt.String(d, &c.Mount)
		case "key":
			return caddyopt.String(d, &c.Key)
		case "timeout":
			return caddyopt.Duration(d, &c.Timeout)
		case "approle":
			c.AppRole = new(AppRole)
			return c.AppRole.unmarshalCaddyfile(d)
		case "tls":
			c.TLS = new(TLS)
			return c.TLS.unmarshalCaddyfile(d)
		}
		return caddyopt.Unknown(d, "vault_transit")
	})
}

func (a *AppRole) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if err := caddyopt.NoArgs(d); err != nil {
		return err
	}
	return caddyopt.Block(d, "vault_transit approle", func(opt string) error {
		switch opt {
		case "role_id":
			return caddyopt.String(d, &a.RoleID)
		case "secret_id":
			return caddyopt.String(d, &a.SecretID)
		case "mount":
			return caddyopt.String(d, &a.Mount)
		}
		return caddyopt.Unknown(d, "vault_transit approle")
	})
}

func (t *TLS) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if err := caddyopt.NoArgs(d); err != nil {
		return err
	}
	return caddyopt.Block(d, "vault_transit tls", func(opt string) error {
		switch opt {
		case "ca_file":
			return caddyopt.String(d, &t.CAFile)
		case "server_name":
			return caddyopt.String(d, &t.ServerName)
		}
		return caddyopt.Unknown(d, "vault_transit tls")
	})
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Cipher)(nil)
