package postgres

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/toolgate/toolgate/internal/caddyopt"
)

// The dsn holds the database's password, often from a placeholder: one
// left empty or misspelt would quietly drop it, a value with a character
// that ends a URL's user and password would send the rest to pgx as the
// host, and pgx's own parse errors quote what they cannot parse. So the
// dsn is checked here before pgx sees it, and never repeated in an error.

// expandDSN replaces the placeholders of raw, the dsn option, refusing
// one that would lose or expose a part of it.
func expandDSN(raw string) (string, error) {
	repl := caddy.NewReplacer()
	if ph := caddyopt.EmptyPlaceholder(repl, raw); ph != "" {
		// Replaced by nothing, a password would quietly be none.
		return "", fmt.Errorf("dsn: %s", caddyopt.Unset(ph))
	}
	if ph := caddyopt.MisspeltPlaceholder(repl, raw); ph != "" {
		return "", fmt.Errorf("dsn: %s is a placeholder Caddy does not know: check its spelling, as in {env.NAME} (write a brace meant as text as \\{)", ph)
	}
	if ph := urlBreakingPlaceholder(repl, raw); ph != "" {
		return "", fmt.Errorf("dsn: the value of %s holds '@', '/', '?' or '#', which end a URL's user and password (the rest would be taken for the host and database): percent-encode them (%%40, %%2F, %%3F, %%23) in its value, or give the dsn as keyword=value pairs", ph)
	}
	dsn := repl.ReplaceKnown(raw, "") // braces of another kind are text (a password's)
	if err := emptyPassword(dsn); err != nil {
		return "", fmt.Errorf("dsn: %v", err)
	}
	if dsn == "" {
		return "", fmt.Errorf("dsn %s", emptyDSN(raw))
	}
	return dsn, nil
}

// emptyPassword refuses a DSN that spells out an empty password
// ("user:@host", or "password=" followed by nothing or by two quotes):
// what a variable not set leaves when the Caddyfile's {$NAME} was
// replaced as the file was read. A DSN meant without a password leaves
// it out.
func emptyPassword(dsn string) error {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		if p, set := u.User.Password(); set && p == "" {
			return errors.New("its password is empty (user:@): is the variable that gives it set? Leave out the colon where no password is meant")
		}
		return nil
	}
	if emptyKeywordPassword.MatchString(dsn) {
		return errors.New("its password is empty (password=): is the variable that gives it set? Leave password out where none is meant")
	}
	return nil
}

// urlBreakingPlaceholder is the first placeholder in the user and password
// of a URL dsn whose value holds a character that ends them ('@', '/',
// '?', '#'), "" when there is none: pasted as it is, part of a password
// would be taken for the host and database, and show in errors and logs.
func urlBreakingPlaceholder(repl *caddy.Replacer, dsn string) string {
	scheme, rest, ok := strings.Cut(dsn, "://")
	if !ok || (scheme != "postgres" && scheme != "postgresql") {
		return ""
	}
	at := userinfoEnd(rest)
	if at < 0 {
		return ""
	}
	var found string
	_, _ = repl.ReplaceFunc(rest[:at], func(key string, val any) (any, error) {
		if found == "" && strings.ContainsAny(caddy.ToString(val), "@/?#") {
			found = "{" + key + "}"
		}
		return val, nil
	})
	return found
}

// userinfoEnd is the index of the '@' that ends the user and password of
// rest, a URL after its "://" whose placeholders are not replaced yet, -1
// when it has none: the last '@' of the authority, which the first '/',
// '?' or '#' outside a placeholder ends.
func userinfoEnd(rest string) int {
	depth, at := 0, -1
	for i := 0; i < len(rest); i++ {
		switch c := rest[i]; {
		case c == '\\':
			i++ // an escaped brace is text
		case c == '{':
			depth++
		case c == '}' && depth > 0:
			depth--
		case depth > 0:
		case c == '@':
			at = i
		case c == '/' || c == '?' || c == '#':
			return at
		}
	}
	return at
}

// emptyKeywordPassword matches an empty password in a keyword/value DSN.
var emptyKeywordPassword = regexp.MustCompile(`(?:^|\s)password\s*=\s*(?:''(?:\s|$)|$|\s+\w+\s*=)`)

// emptyDSN explains an empty DSN without repeating it (it may hold a
// password).
func emptyDSN(raw string) string {
	if raw == "" {
		return "is required"
	}
	return "is empty once its placeholders are expanded: is the environment variable it names set?"
}

// parseError is pgx's refusal of a DSN without the DSN, nor what pgx
// quotes of it: it masks the password only where it parsed one, and a
// DSN that does not parse (a password with a space, unquoted) has it in
// the words it quotes. What is left names the failing option.
func parseError(err error) error {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return errors.New("it does not parse")
	}
	bare := *pe
	bare.ConnString = "" // (its own words, without the DSN)
	what, ok := strings.CutPrefix(bare.Error(), "cannot parse ``: ")
	if inner := bare.Unwrap(); inner != nil {
		what = strings.TrimSuffix(what, " ("+inner.Error()+")")
	}
	if !ok || strings.ContainsAny(what, "`\"=") {
		what = "it does not parse"
	}
	return fmt.Errorf("%s: %s; the dsn is not repeated here, as it may hold a password", what, dsnHint(what))
}

// dsnHint says what pgx's refusal what asks for.
func dsnHint(what string) string {
	switch option, _ := strings.CutPrefix(what, "cannot parse "); {
	case what == "pool_max_conns too small":
		return "it takes a whole number of connections, at least 1"
	case strings.HasPrefix(option, "pool_") && strings.HasSuffix(option, "_conns"):
		return "it takes a whole number of connections"
	case strings.HasPrefix(option, "pool_"):
		return "it takes a duration, such as 30s, 5m or 1h"
	case what == "invalid port":
		return "a port is a number from 1 to 65535"
	case what == "invalid connect_timeout":
		return "it takes a whole number of seconds"
	case what == "failed to parse as keyword/value":
		return "quote a value with spaces as 'a b' (and a quote in it as \\'), or give the dsn as a URL"
	case what == "failed to parse as URL":
		return "percent-encode '@', '/', '?', '#', '%' and spaces in the user and password"
	case what == "failed to configure TLS":
		return "sslmode takes disable, allow, prefer, require, verify-ca or verify-full, and sslrootcert, sslcert and sslkey name files toolgate can read"
	}
	return "check its syntax (quote a value with spaces as 'a b' in keyword=value form, percent-encode it in a URL)"
}
