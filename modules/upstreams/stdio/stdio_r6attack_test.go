package stdio

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// Attacks on b23afad's warning about a program's environment variable
// whose placeholder is empty (Transport.expand).

func r6Expand(t *testing.T, env map[string]string) (*Transport, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	tr := &Transport{Command: []string{"server"}, Env: env, logger: zap.New(core)}
	tr.expand(caddy.NewReplacer())
	return tr, logs
}

// Found and fixed. Attack: the program's token comes from a file placeholder
// whose file is missing (a secrets volume not mounted). Caddy's file
// provider answers (nil, true); EmptyPlaceholder reads nil as "<nil>" and
// finds nothing empty: the program starts with GITHUB_TOKEN="" and no
// warning, the case b23afad meant to warn about (toolgate's own log shows
// only Caddy's "failed to read file", not which variable went empty).
// Severity: low (a warning missing; the program fails in its own words or
// acts as nobody).
// Fix (done): caddy.ToString(v) in EmptyPlaceholder (nil is "").
func TestR6StdioEnvFromMissingFileIsWarned(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "secrets", "github-token")
	tr, logs := r6Expand(t, map[string]string{"GITHUB_TOKEN": "{file." + missing + "}"})
	if tr.Env["GITHUB_TOKEN"] != "" {
		t.Fatalf("premise: expanded to %q", tr.Env["GITHUB_TOKEN"])
	}
	if n := logs.FilterMessageSnippet("environment is empty").Len(); n != 1 {
		t.Errorf("%d warnings for a variable whose file is missing, want 1: %v", n, logs.All())
	}
}

// Found and fixed. Attack: a misspelt placeholder ({evn.GITHUB_TOKEN}). ReplaceKnown
// leaves it as text, and the program gets the configuration's own text as
// its token; EmptyPlaceholder skips placeholders Caddy does not know, so
// nothing is said. caddyopt.Secret refuses this very case for every other
// secret of the configuration ("left as text, it would be the secret").
// Severity: low (no warning; the program sends "{evn.GITHUB_TOKEN}" as its
// token to its own upstream).
// Fix (done): warn also when a variable holds a placeholder Caddy does not know
// (ReplaceOrErr(v, false, true) failing), naming the placeholder.
func TestR6StdioEnvMisspeltPlaceholderIsWarned(t *testing.T) {
	t.Setenv("GITHUB_TOKEN_R6", "ghp_r6")
	tr, logs := r6Expand(t, map[string]string{"GITHUB_TOKEN": "{evn.GITHUB_TOKEN_R6}"})
	if tr.Env["GITHUB_TOKEN"] != "{evn.GITHUB_TOKEN_R6}" {
		t.Fatalf("premise: expanded to %q", tr.Env["GITHUB_TOKEN"])
	}
	if logs.Len() == 0 {
		t.Errorf("the program got its token's placeholder text %q as the token, and nothing was logged", tr.Env["GITHUB_TOKEN"])
	}
}

// Held: the warning names the variable and the placeholder, never a value
// — neither a literal secret beside the placeholder nor another
// placeholder's value — and a blank (spaces only) variable is warned about.
func TestR6StdioEnvWarningShowsNoValue(t *testing.T) {
	t.Setenv("TOOLGATE_R6_SET", "s3cret-from-env")
	t.Setenv("TOOLGATE_R6_BLANK", "   ")
	_, logs := r6Expand(t, map[string]string{
		"API_KEY":  "literal-s3cret:{env.TOOLGATE_R6_SET}:{env.TOOLGATE_R6_UNSET}",
		"OTHER":    "{env.TOOLGATE_R6_BLANK}",
		"FINE_KEY": "{env.TOOLGATE_R6_SET}",
	})
	warned := logs.FilterMessageSnippet("environment is empty").All()
	if len(warned) != 2 {
		t.Fatalf("%d warnings, want 2: %v", len(warned), logs.All())
	}
	for _, e := range warned {
		for k, v := range e.ContextMap() {
			s, _ := v.(string)
			if strings.Contains(s, "s3cret") {
				t.Errorf("the warning's %s shows a value: %q", k, s)
			}
		}
	}
}
