package caddyopt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// Attacks on b23afad: EmptyPlaceholder and Secret refusing a secret a
// placeholder left partly empty ("prefix-{env.UNSET}").

// Found and fixed. Attack: a secret put together from a prefix and a {file.…}
// placeholder whose file does not exist (a secrets mount missing, a
// misspelt path). Caddy's file provider answers such a key with (nil,
// true): known, and replaced by nothing. EmptyPlaceholder tests the value
// with fmt.Sprint, which turns nil into "<nil>", not empty: the
// placeholder is not reported, and Secret returns the prefix alone as the
// secret ("prefix-") — exactly the partial value b23afad meant to refuse.
// (A whole-value "{file./missing}" is caught by the older check; only the
// partial one slips through.)
// Severity: medium (a secret quietly reduced to its constant prefix — a
// webhook signed with a key everyone reading the configuration knows, an
// OAuth client_secret that is only its prefix).
// Fix (done): test the value with caddy.ToString (nil is ""), not fmt.Sprint.
func TestR6EmptyPlaceholderMissingFileSlipsThrough(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "not-mounted", "webhook-secret")
	repl := caddy.NewReplacer()
	raw := "whsec-{file." + missing + "}"
	if got := EmptyPlaceholder(repl, raw); got != "{file."+missing+"}" {
		t.Errorf("EmptyPlaceholder(%q) = %q, want the missing file's placeholder", raw, got)
	}
	if got, err := Secret(repl, raw); err == nil {
		t.Errorf("Secret(%q) = %q, nil: a secret whose file is missing became its constant prefix", raw, got)
	}
}

// Found and fixed. Attack: a {file.…} placeholder whose path holds a character
// outside the regexp's [A-Za-z0-9_.\-/] — a space, '@', '+', '~', ':' —
// all valid in a path, and all placeholders Caddy expands. The file
// exists but is empty (a secret not written yet): the placeholder regexp
// never matches it, so EmptyPlaceholder reports nothing and Secret returns
// the prefix alone.
// Severity: low-medium (same effect as above, for paths with such
// characters, e.g. Kubernetes' "..data" links are fine but "/run/secrets/
// db password" or "/srv/app@prod/key" are not).
// Fix (done): find placeholders the way Caddy's replacer does (an unescaped '{'
// to the next unescaped '}'), not with a narrower character class; or
// compare each part's expansion directly through a ReplacementFunc passed
// to ReplaceFunc/ReplaceOrErr, which sees every key Caddy expands.
func TestR6EmptyPlaceholderRegexpMissesPathCharacters(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"db password", "key@prod", "key+1", "key~", "key:1"} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte("\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		raw := "prefix-{file." + path + "}"
		repl := caddy.NewReplacer()
		if got := EmptyPlaceholder(repl, raw); got == "" {
			t.Errorf("EmptyPlaceholder(%q) = \"\": the empty file's placeholder is not found", raw)
		}
		if got, err := Secret(repl, raw); err == nil {
			t.Errorf("Secret(%q) = %q, nil: the empty file's part was quietly dropped", raw, got)
		}
	}
}

// Found and fixed. Attack (false refusal): a secret that legitimately holds a
// brace pair, escaped as Caddy wants (`\{`), e.g. a token whose text is
// "abc{env.X}def" by chance, or an operator quoting a literal brace. Caddy
// expands `abc\{env.NOT_SET}def` to the literal `abc{env.NOT_SET}def`, and
// ReplaceOrErr accepts it; EmptyPlaceholder's regexp ignores the escape,
// looks `{env.NOT_SET}` up, finds it empty, and Secret refuses a valid
// secret (and names a part of it in the error).
// Severity: low (a valid configuration refused at start; the error quotes
// a fragment of the secret).
// Fix (done): skip escaped braces as Caddy's replacer does (or collect the keys
// Caddy itself expands, through a ReplacementFunc).
func TestR6EscapedBraceSecretFalselyRefused(t *testing.T) {
	t.Setenv("TOOLGATE_R6_NOT_SET", "")
	repl := caddy.NewReplacer()
	raw := `abc\{env.TOOLGATE_R6_NOT_SET}def`
	want := "abc{env.TOOLGATE_R6_NOT_SET}def"
	got, err := Secret(repl, raw)
	if err != nil || got != want {
		t.Errorf("Secret(%q) = %q, %v; want %q (an escaped brace is text, not a placeholder)", raw, got, err, want)
	}
	if ph := EmptyPlaceholder(repl, raw); ph != "" {
		t.Errorf("EmptyPlaceholder(%q) = %q, want \"\" (escaped)", raw, ph)
	}
}

// Held: a value whose placeholder is set to non-blank text, among others
// that are unknown text (not placeholders Caddy knows), is not reported;
// and the placeholder reported is the configuration's text, never the
// value of another placeholder.
func TestR6EmptyPlaceholderNamesNoValue(t *testing.T) {
	t.Setenv("TOOLGATE_R6_SET", "s3cr3t-value")
	t.Setenv("TOOLGATE_R6_EMPTY", "")
	repl := caddy.NewReplacer()
	raw := "{env.TOOLGATE_R6_SET}:{env.TOOLGATE_R6_EMPTY}"
	ph := EmptyPlaceholder(repl, raw)
	if ph != "{env.TOOLGATE_R6_EMPTY}" {
		t.Fatalf("EmptyPlaceholder = %q", ph)
	}
	_, err := Secret(repl, raw)
	if err == nil || strings.Contains(err.Error(), "s3cr3t-value") {
		t.Fatalf("Secret: %v", err)
	}
}
