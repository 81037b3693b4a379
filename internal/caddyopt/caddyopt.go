// Package caddyopt reads the options of toolgate's Caddyfile blocks, the
// same strict way in every module: each option at most once (unless it is
// meant to repeat), exact argument counts, and errors that name the block
// and the option.
package caddyopt

import (
	"errors"
	"fmt"
	"net"
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

// URLError is what a url.Parse error, or an HTTP client's, says without
// the URL it quotes (which may hold a password, or a secret in its query):
// "invalid URL escape "%zz"", or "dial tcp …: connection refused", say.
func URLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// LoopbackHost reports whether host (a URL's Hostname) is "localhost" or a
// loopback IP address: a server on this machine, reached without crossing
// a network.
func LoopbackHost(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// FetchURL checks s, the URL of a server toolgate fetches keys or secrets
// from: https, or plain http only to a loopback address (a local test
// server), because anyone on the path of plain http could answer in the
// server's place. It needs a host and has no fragment; a user and
// password (a server behind basic auth) are the caller's to allow. The
// error quotes s without its password; the caller names the option.
func FetchURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("%q: %v", RedactURL(s), URLError(err))
	case u.Scheme != "https" && u.Scheme != "http":
		return fmt.Errorf("%q must start with https://", RedactURL(s))
	case u.Host == "":
		return fmt.Errorf("%q has no host", RedactURL(s))
	case strings.Contains(s, "#"):
		return fmt.Errorf("%q must not have a fragment (#…): it is never sent", RedactURL(s))
	case u.Scheme == "http" && !LoopbackHost(u.Hostname()):
		return fmt.Errorf("%q: plain http is allowed only to a loopback address (a local test server); use https://", RedactURL(s))
	}
	return nil
}

// HeaderName reports whether s can name an HTTP header: one or more token
// characters (RFC 9110, section 5.1), so no spaces, colons or controls.
func HeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 || !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// HeaderValue reports whether s can be an HTTP header's value: no control
// characters but tab, so no line break that would end the header and
// start another (RFC 9110, section 5.5).
func HeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// DurationText is d as an operator writes it in a Caddyfile: "5m" and
// "1h", not Go's "5m0s" and "1h0m0s".
func DurationText(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Secret is raw, a secret given in the configuration, with its
// placeholders replaced. A placeholder Caddy does not know (a misspelt
// {env.NAME}) is an error: left as text, it would be the secret — one that
// everyone who reads the configuration knows. So is a secret given that
// is empty once replaced (an environment variable not set): going on
// without it would quietly make, say, a confidential OAuth client a public
// one, or an approvals webhook unsigned. The error never quotes raw.
func Secret(repl *caddy.Replacer, raw string) (string, error) {
	v, err := repl.ReplaceOrErr(raw, false, true)
	if err != nil {
		return "", errors.New("holds a placeholder Caddy does not know (left as text, it would be the secret): check its spelling, as in {env.NAME}")
	}
	if ph := EmptyPlaceholder(repl, raw); ph != "" {
		return "", errors.New("is empty once placeholders are replaced (" + ph + " is): is its environment variable (or file) set?")
	}
	if raw != "" && strings.TrimSpace(v) == "" {
		return "", errors.New("is empty once placeholders are replaced: is its environment variable (or file) set? Leave the option out where no secret is meant")
	}
	return v, nil
}

// EmptyPlaceholder is the first placeholder in raw that Caddy knows and
// that is empty ({env.NAME} of a variable not set, {file.path} of a file
// missing or empty), "" when there is none. A value put together from
// parts (a secret's prefix, a DSN's password) would otherwise quietly lose
// that part. The placeholder names where the value comes from, never the
// value.
func EmptyPlaceholder(repl *caddy.Replacer, raw string) string {
	empty, _ := placeholders(repl, raw)
	return empty
}

// Unset says why ph, a placeholder EmptyPlaceholder found, is empty, in
// the words of its kind: an environment variable not set, a file missing
// or empty.
func Unset(ph string) string {
	key := strings.TrimSuffix(strings.TrimPrefix(ph, "{"), "}")
	if name, ok := strings.CutPrefix(key, "env."); ok {
		return "the environment variable " + name + " (" + ph + ") is not set, or empty"
	}
	if path, ok := strings.CutPrefix(key, "file."); ok {
		return "the file " + path + " (" + ph + ") is missing, or empty"
	}
	return ph + " is empty"
}

// MisspeltPlaceholder is the first placeholder in raw that Caddy does not
// know yet is spelt as its own are, a prefix and a name ({evn.NAME}), ""
// when there is none. Where unknown placeholders are kept as text (a DSN,
// a program's environment), one misspelt would be the value. Braces
// without a dot ("p{a}ss") are taken for text.
func MisspeltPlaceholder(repl *caddy.Replacer, raw string) string {
	_, unknown := placeholders(repl, raw)
	return unknown
}

// placeholders finds, as Caddy's replacer does (escaped braces are text),
// the first placeholder of raw Caddy knows that is empty, and the first it
// does not know spelt as one of its own.
func placeholders(repl *caddy.Replacer, raw string) (empty, unknown string) {
	_, _ = repl.ReplaceFunc(raw, func(key string, val any) (any, error) {
		_, known := repl.Get(key)
		switch {
		case !known && unknown == "" && strings.Contains(key, "."):
			unknown = "{" + key + "}"
		case known && empty == "" && strings.TrimSpace(caddy.ToString(val)) == "":
			empty = "{" + key + "}"
		}
		return val, nil
	})
	return empty, unknown
}
