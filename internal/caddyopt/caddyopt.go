// Package caddyopt reads the options of toolgate's Caddyfile blocks, the
// same strict way in every module: each option at most once (unless it is
// meant to repeat), exact argument counts, and errors that name the block
// and the option.
package caddyopt

import (
	"errors"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// Block calls option for each option of the block that follows the current
// token, with the dispenser on the option's name. An option given twice is
// an error naming block, unless repeats lists it.
func Block(d *caddyfile.Dispenser, block string, option func(name string) error, repeats ...string) error {
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if seen[name] && !contains(repeats, name) {
			return d.Errf("%s: %s given twice", block, name)
		}
		seen[name] = true
		if err := option(name); err != nil {
			return err
		}
	}
	return nil
}

// Unknown is the error for an option block does not have.
func Unknown(d *caddyfile.Dispenser, block string) error {
	return d.Errf("%s: unknown option %q", block, d.Val())
}

// String reads the current option's one argument into dst.
func String(d *caddyfile.Dispenser, dst *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// Duration reads the current option's one argument, a positive duration
// ("30s", "2h", or Caddy's "1d"), into dst.
func Duration(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	name := d.Val()
	var s string
	if err := String(d, &s); err != nil {
		return err
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil {
		return d.Errf("%s: invalid duration %q: %v", name, s, err)
	}
	if dur <= 0 {
		return d.Errf("%s: invalid duration %q: must be positive", name, s)
	}
	*dst = caddy.Duration(time.Duration(dur))
	return nil
}

// NoArgs checks that the current token has no arguments.
func NoArgs(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Bare reads a directive that takes neither arguments nor options; hint
// says where its settings live instead.
func Bare(d *caddyfile.Dispenser, hint string) error {
	d.Next() // the directive's name
	name := d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(d.Nesting()) {
		return d.Errf("%s takes no options; %s", name, hint)
	}
	return nil
}

// RedactURL is s, a configured URL quoted in a message, with everything
// between the scheme and the last "@" replaced by "xxxxx": the userinfo
// (user:password@) of a URL, and of text that does not parse as one (a
// password may hold "/", "?" or "#", so no part of the text is taken for
// the host). A URL with "@" in its path or query loses more than its
// userinfo; a message refusing a URL must never repeat a password.
func RedactURL(s string) string {
	pre, rest := "", s
	if i := strings.Index(s, "://"); i >= 0 {
		pre, rest = s[:i+3], s[i+3:]
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		return pre + "xxxxx" + rest[at:]
	}
	return s
}

// URLError is what a url.Parse error says without the URL it quotes (which
// may hold a password): "invalid URL escape "%zz"", say.
func URLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
