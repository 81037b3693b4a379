package postgres

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/toolgate/toolgate/internal/caddyopt"
)

// UnmarshalCaddyfile reads
//
//	postgres [<dsn>] {
//		dsn        <dsn>
//		schema     <name>
//		table      <name>
//		lock_lease <duration>
//	}
//
// Each option at most once; the DSN either inline or as the dsn option.
func (s *Storage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the module name
	if d.NextArg() {
		s.DSN = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	const block = "storage postgres"
	err := caddyopt.Block(d, block, func(name string) error {
		switch name {
		case "dsn":
			if s.DSN != "" {
				return d.Errf("%s: dsn given twice", block)
			}
			return caddyopt.String(d, &s.DSN)
		case "schema":
			return caddyopt.String(d, &s.Schema)
		case "table":
			return caddyopt.String(d, &s.Table)
		case "lock_lease":
			return caddyopt.Duration(d, &s.LockLease)
		default:
			return caddyopt.Unknown(d, block)
		}
	})
	if err != nil {
		return err
	}
	if s.DSN == "" {
		return d.Errf("%s: dsn is required", block)
	}
	return nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Storage)(nil)
