package kms

import (
	"strconv"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/toolgate/toolgate/internal/caddyopt"
)

// UnmarshalCaddyfile sets up the cipher from Caddyfile tokens. The dispenser
// starts at the module name, as caddyfile.UnmarshalModule leaves it:
//
//	kms {
//		key_url    <url>
//		region     <region>
//		endpoint   <url>
//		timeout    <duration>
//		cache_ttl  <duration>
//		cache_size <count>
//	}
//
// Every sub-option takes exactly one argument and may appear at most once.
// Placeholders are kept as written and expanded at Provision; nothing is
// contacted.
func (c *Cipher) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if !d.Next() { // consume the module name
		return d.Err("expected tokens")
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	return caddyopt.Block(d, "kms", func(opt string) error {
		switch opt {
		case "key_url":
			return caddyopt.String(d, &c.KeyURL)
		case "region":
			return caddyopt.String(d, &c.Region)
		case "endpoint":
			return caddyopt.String(d, &c.Endpoint)
		case "timeout":
			return caddyopt.Duration(d, &c.Timeout)
		case "cache_ttl":
			return caddyopt.Duration(d, &c.CacheTTL)
		case "cache_size":
			var s string
			if err := caddyopt.String(d, &s); err != nil {
				return err
			}
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return d.Errf("kms: cache_size %q must be a whole number of keys, at least 1", s)
			}
			c.CacheSize = n
			return nil
		}
		return caddyopt.Unknown(d, "kms")
	})
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Cipher)(nil)
