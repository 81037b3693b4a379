package vaulttransit

import (
	"github.com/caddyserver/caddy/v2"
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
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return d.Errf("vault_transit: duplicate option '%s'", opt)
		}
		seen[opt] = true
		var err error
		switch opt {
		case "address":
			err = caddyopt.String(d, &c.Address)
		case "token":
			err = caddyopt.String(d, &c.Token)
		case "namespace":
			err = caddyopt.String(d, &c.Namespace)
		case "mount":
			err = caddyopt.String(d, &c.Mount)
		case "key":
			err = caddyopt.String(d, &c.Key)
		case "timeout":
			var s string
			if err = caddyopt.String(d, &s); err != nil {
				break
			}
			dur, perr := caddy.ParseDuration(s)
			if perr != nil {
				return d.Errf("vault_transit: invalid timeout '%s': %v", s, perr)
			}
			if dur <= 0 {
				return d.Errf("vault_transit: timeout must be positive, got '%s'", s)
			}
			c.Timeout = caddy.Duration(dur)
		case "approle":
			c.AppRole = new(AppRole)
			err = c.AppRole.unmarshalCaddyfile(d)
		case "tls":
			c.TLS = new(TLS)
			err = c.TLS.unmarshalCaddyfile(d)
		default:
			return d.Errf("vault_transit: unknown option '%s'", opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (a *AppRole) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return d.Errf("vault_transit: approle: duplicate option '%s'", opt)
		}
		seen[opt] = true
		var err error
		switch opt {
		case "role_id":
			err = caddyopt.String(d, &a.RoleID)
		case "secret_id":
			err = caddyopt.String(d, &a.SecretID)
		case "mount":
			err = caddyopt.String(d, &a.Mount)
		default:
			return d.Errf("vault_transit: approle: unknown option '%s'", opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (t *TLS) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return d.Errf("vault_transit: tls: duplicate option '%s'", opt)
		}
		seen[opt] = true
		var err error
		switch opt {
		case "ca_file":
			err = caddyopt.String(d, &t.CAFile)
		case "server_name":
			err = caddyopt.String(d, &t.ServerName)
		default:
			return d.Errf("vault_transit: tls: unknown option '%s'", opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Cipher)(nil)
