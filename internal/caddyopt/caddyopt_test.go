package caddyopt

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

type opts struct {
	name  string
	wait  caddy.Duration
	items []string
}

func parse(input string) (opts, error) {
	var o opts
	d := caddyfile.NewTestDispenser(input)
	d.Next()
	err := Block(d, "thing", func(name string) error {
		switch name {
		case "name":
			return String(d, &o.name)
		case "wait":
			return Duration(d, &o.wait)
		case "item":
			var s string
			err := String(d, &s)
			o.items = append(o.items, s)
			return err
		}
		return Unknown(d, "thing")
	}, "item")
	return o, err
}

func TestBlock(t *testing.T) {
	o, err := parse("thing {\n name x\n wait 2s\n item a\n item b\n}")
	if err != nil || o.name != "x" || time.Duration(o.wait) != 2*time.Second || strings.Join(o.items, ",") != "a,b" {
		t.Fatalf("parsed %+v, %v", o, err)
	}
	for input, want := range map[string]string{
		"thing {\n name x\n name y\n}": "thing: name given twice",
		"thing {\n nope 1\n}":          `thing: unknown option "nope"`,
		"thing {\n name\n}":            "wrong argument count",
		"thing {\n name a b\n}":        "wrong argument count",
		"thing {\n wait soon\n}":       `wait: invalid duration "soon"`,
		"thing {\n wait 0s\n}":         `wait: invalid duration "0s": must be positive`,
	} {
		if _, err := parse(input); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want %q", input, err, want)
		}
	}
}

func TestBare(t *testing.T) {
	if err := Bare(caddyfile.NewTestDispenser("toolgate_x"), "hint"); err != nil {
		t.Fatal(err)
	}
	if err := Bare(caddyfile.NewTestDispenser("toolgate_x arg"), "hint"); err == nil {
		t.Error("an argument was accepted")
	}
	if err := Bare(caddyfile.NewTestDispenser("toolgate_x {\n a b\n}"), "see the docs"); err == nil || !strings.Contains(err.Error(), "toolgate_x takes no options; see the docs") {
		t.Errorf("a block: err = %v", err)
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://svc:s3cret@host/%zz/mcp":   "https://xxxxx@host/%zz/mcp",
		"https://host/a@b":                  "https://xxxxx@b",
		"https://svc:pa/ss-s3cr3t@host/mcp": "https://xxxxx@host/mcp",
		"https://svc:pa?s#s@host":           "https://xxxxx@host",
		"https://host/mcp":                  "https://host/mcp",
		"svc:s3cret@host/x":                 "xxxxx@host/x",
		"https://u:p@w@host?q=@":            "https://xxxxx@",
		"http://127.0.0.1:8200":             "http://127.0.0.1:8200",
		"unix:///run/vault.sock":            "unix:///run/vault.sock",
		"https://tok@vault.example.com#x":   "https://xxxxx@vault.example.com#x",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
	//lint:ignore SA1007 the URL is invalid on purpose: its error is what is checked
	_, err := url.Parse("https://svc:s3cret@host/%zz")
	if got := URLError(err).Error(); strings.Contains(got, "s3cret") || !strings.Contains(got, "invalid URL escape") {
		t.Errorf("URLError = %q", got)
	}
}

func TestFetchURL(t *testing.T) {
	for _, ok := range []string{
		"https://idp.example.com/jwks.json",
		"https://user:pw@idp.example.com/jwks.json",
		"http://127.0.0.1:8080/keys",
		"http://localhost/keys",
		"http://[::1]:9000/keys",
	} {
		if err := FetchURL(ok); err != nil {
			t.Errorf("FetchURL(%q) = %v, want nil", ok, err)
		}
	}
	for in, want := range map[string]string{
		"http://idp.example.com/jwks":        "plain http is allowed only to a loopback address",
		"http://user:s3cret@idp.example.com": "plain http is allowed only to a loopback address",
		"ftp://idp.example.com/jwks":         "must start with https://",
		"file:///etc/jwks.json":              "must start with https://",
		"idp.example.com/jwks":               "must start with https://",
		"https:///jwks":                      "has no host",
		"https://idp.example.com/jwks#k":     "must not have a fragment",
		"https://user:s3cret@idp/%zz":        "invalid URL escape",
	} {
		err := FetchURL(in)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("FetchURL(%q) = %v, want an error saying %q without the password", in, err, want)
		}
	}
}

func TestHeaderNameAndValue(t *testing.T) {
	for name, want := range map[string]bool{
		"X-Api-Key": true, "x_key.1!": true, "": false, "X Key": false, "X-Key:": false, "X-Kéy": false, "X-Key\r\n": false,
	} {
		if got := HeaderName(name); got != want {
			t.Errorf("HeaderName(%q) = %v, want %v", name, got, want)
		}
	}
	for value, want := range map[string]bool{
		"Bearer abc": true, "a\tb": true, "": true, "k1\r\nX-Injected: 1": false, "a\x00b": false, "a\x7fb": false,
	} {
		if got := HeaderValue(value); got != want {
			t.Errorf("HeaderValue(%q) = %v, want %v", value, got, want)
		}
	}
}

func TestDurationText(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Hour: "1h", 5 * time.Minute: "5m", 30 * time.Second: "30s", 90 * time.Second: "1m30s",
		time.Hour + time.Minute: "1h1m", time.Nanosecond: "1ns", 8760 * time.Hour: "8760h",
	} {
		if got := DurationText(d); got != want {
			t.Errorf("DurationText(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestSecret(t *testing.T) {
	t.Setenv("TOOLGATE_TEST_SECRET", "from-the-environment")
	repl := caddy.NewReplacer()
	for raw, want := range map[string]string{
		"{env.TOOLGATE_TEST_SECRET}":        "from-the-environment",
		"literal-secret":                    "literal-secret",
		"prefix-{env.TOOLGATE_TEST_SECRET}": "prefix-from-the-environment",
		"":                                  "", // not given: none meant
	} {
		if got, err := Secret(repl, raw); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", raw, got, err, want)
		}
	}
	// Given, but empty once replaced: going on would mean no secret (a
	// public OAuth client, an unsigned webhook).
	t.Setenv("TOOLGATE_TEST_BLANK_SECRET", "  ")
	for _, raw := range []string{"{env.TOOLGATE_TEST_UNSET_SECRET}", "{env.TOOLGATE_TEST_BLANK_SECRET}", "prefix-{env.TOOLGATE_TEST_UNSET_SECRET}"} {
		if got, err := Secret(repl, raw); err == nil || !strings.Contains(err.Error(), "empty once placeholders are replaced") {
			t.Errorf("%s: %q, %v; want the error that it is empty", raw, got, err)
		}
	}
	for _, raw := range []string{"{environment.TOOLGATE_TEST_SECRET}", "{envTOOLGATE_TEST_SECRET}", "s3cret-{nope}"} {
		got, err := Secret(repl, raw)
		if err == nil {
			t.Errorf("%s: taken as the secret %q", raw, got)
		} else if strings.Contains(err.Error(), "TOOLGATE_TEST") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error quotes it: %v", raw, err)
		}
	}
}

func TestEmptyPlaceholder(t *testing.T) {
	t.Setenv("TOOLGATE_TEST_SET", "value")
	repl := caddy.NewReplacer()
	for raw, want := range map[string]string{
		"postgres://u:{env.TOOLGATE_TEST_SET}@db/toolgate":        "",
		"postgres://u:{env.TOOLGATE_TEST_UNSET_PW}@db/toolgate":   "{env.TOOLGATE_TEST_UNSET_PW}",
		"{env.TOOLGATE_TEST_SET}-{env.TOOLGATE_TEST_UNSET_OTHER}": "{env.TOOLGATE_TEST_UNSET_OTHER}",
		"host=db password=p{a}ss":                                 "", // not a placeholder Caddy knows: text
		"no placeholders":                                         "",
	} {
		if got := EmptyPlaceholder(repl, raw); got != want {
			t.Errorf("EmptyPlaceholder(%q) = %q, want %q", raw, got, want)
		}
	}
}

func TestUnset(t *testing.T) {
	for ph, want := range map[string]string{
		"{env.PGPASSWORD}":      "the environment variable PGPASSWORD ({env.PGPASSWORD}) is not set, or empty",
		"{file./run/secrets/x}": "the file /run/secrets/x ({file./run/secrets/x}) is missing, or empty",
		"{system.hostname}":     "{system.hostname} is empty",
	} {
		if got := Unset(ph); got != want {
			t.Errorf("Unset(%q) = %q, want %q", ph, got, want)
		}
	}
}
