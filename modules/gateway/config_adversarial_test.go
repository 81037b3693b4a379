package gateway_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/toolgate/toolgate/internal/impliedsession"
	_ "github.com/toolgate/toolgate/internal/toolpin"
	"github.com/toolgate/toolgate/modules/gateway"
	_ "github.com/toolgate/toolgate/modules/upstreams/sse"
)

// load provisions and validates app as Caddy does when a config loads
// (Provision, then Validate), on a file_system storage in a temporary
// directory. It returns the first error.
func load(t *testing.T, app *gateway.App) error {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if app.StorageRaw == nil {
		root, _ := json.Marshal(t.TempDir())
		app.StorageRaw = json.RawMessage(`{"module":"file_system","root":` + string(root) + `}`)
	}
	err := app.Provision(ctx)
	t.Cleanup(func() { _ = app.Cleanup() })
	if err != nil {
		return err
	}
	return app.Validate()
}

// loadCaddyfile reads a toolgate global option and loads it.
func loadCaddyfile(t *testing.T, input string) (*gateway.App, error) {
	t.Helper()
	app, err := unmarshal(input)
	if err != nil {
		return app, err
	}
	return app, load(t, app)
}

// loadJSON reads the toolgate app's JSON and loads it.
func loadJSON(t *testing.T, config string) (*gateway.App, error) {
	t.Helper()
	app := new(gateway.App)
	if err := json.Unmarshal([]byte(config), app); err != nil {
		t.Fatalf("config does not decode: %v", err)
	}
	return app, load(t, app)
}

// jwtConfig is an auth block with one jwt issuer whose options are body.
func jwtConfig(body string) string {
	return "toolgate {\n auth {\n jwt {\n issuer https://idp.example.com\n audience gw\n" + body + "\n }\n }\n}"
}

// Attack (fixed): `jwks_url http://idp.example.com/jwks` (plain http to a remote
// host), and URLs with schemes toolgate cannot fetch (ftp:, file:), load
// without a word. Over plain http anyone on the path can serve their own
// JWKS and mint tokens for any user; ftp:/file: fail only when the app
// starts, as a warning, and every JWT is then refused.
// Fixed: jwks_url must be https (plain http only to a loopback address) with a host and no fragment; the refusal names the issuer and jwks_url, with any password redacted (caddyopt.FetchURL).
func TestAttackJWKSURLSchemeNotChecked(t *testing.T) {
	for _, u := range []string{
		"http://idp.example.com/.well-known/jwks.json",
		"ftp://idp.example.com/jwks.json",
		"file:///etc/toolgate/jwks.json",
		"idp.example.com/jwks.json",
	} {
		t.Run(u, func(t *testing.T) {
			_, err := loadCaddyfile(t, jwtConfig("jwks_url "+u))
			if err == nil {
				t.Errorf("jwks_url %s accepted: want a refusal saying jwks_url must be https (http only on loopback)", u)
			} else if !strings.Contains(err.Error(), "jwks_url") {
				t.Errorf("error does not name jwks_url: %v", err)
			}
		})
	}
}

// Attack (fixed): two `jwt` blocks with the same issuer load fine, but only the
// first is ever consulted (verifyJWT stops at the first issuer match):
// the second block's audience, keys and claims are silently dead.
// Fixed: a second jwt block for an issuer is refused at provision: "auth jwt <iss>: issuer given twice".
func TestAttackDuplicateJWTIssuerSilentlyShadowed(t *testing.T) {
	_, err := loadCaddyfile(t, `toolgate {
		auth {
			jwt {
				issuer   https://idp.example.com
				audience gw
				jwks_url https://idp.example.com/jwks-a.json
			}
			jwt {
				issuer   https://idp.example.com
				audience other
				jwks_url https://idp.example.com/jwks-b.json
				user_claim email
			}
		}
	}`)
	if err == nil {
		t.Error("two jwt blocks for issuer https://idp.example.com accepted: the second is never used; want `auth jwt https://idp.example.com: issuer given twice`")
	}
}

// Attack (fixed): `leeway 8760h` is accepted: a token that expired a year ago
// still authenticates (and is cached until exp+leeway). A negative leeway
// in JSON is accepted too (tokens then expire early, nbf is shifted).
// Fixed: leeway outside 0 to 5m (Caddyfile or JSON) is refused at provision, naming the issuer, the bounds and the default.
func TestAttackJWTLeewayUnbounded(t *testing.T) {
	t.Run("caddyfile 8760h", func(t *testing.T) {
		if _, err := loadCaddyfile(t, jwtConfig("jwks_url https://idp.example.com/jwks\n leeway 8760h")); err == nil {
			t.Error("leeway 8760h accepted: want a bound (minutes) on clock skew")
		}
	})
	t.Run("json negative", func(t *testing.T) {
		_, err := loadJSON(t, `{"auth":{"jwt":[{"issuer":"https://idp.example.com","audience":["gw"],
			"jwks_url":"https://idp.example.com/jwks","leeway":-3600000000000}]}}`)
		if err == nil {
			t.Error("leeway -1h accepted: want `leeway must be positive`")
		}
	})
}

// Attack (fixed): `allowed_origins null` loads, and then every page in a sandboxed
// iframe, a data: URL or a file: page (all send `Origin: null`) passes the
// DNS-rebinding check; the Origin check is off without saying so.
// Fixed: null and * are refused in allowed_origins (Validate), saying to list each origin as scheme://host[:port].
func TestAttackAllowedOriginNullDisablesOriginCheck(t *testing.T) {
	app, err := loadCaddyfile(t, "toolgate {\n allowed_origins null\n}")
	if err != nil {
		return // refused: fixed
	}
	r := httptest.NewRequest("POST", "https://gw.example.com/v1/mcp/s", nil)
	r.Header.Set("Origin", "null")
	t.Errorf("allowed_origins null accepted (a request with Origin: null now passes CheckOrigin: %v); want a refusal: an origin is scheme://host[:port]", app.CheckOrigin(r))
}

// Attack (fixed): allowed_origins entries that can never equal a browser's Origin
// header (no scheme, upper case, a path, a default port, a wildcard) load
// silently; the browser client they were meant for is refused and the
// administrator is never told why.
// Fixed: Validate refuses an allowed_origins entry that is not lower-case http(s)://host[:port] without path, query, user or default port, naming it and the form.
func TestAttackAllowedOriginsMalformedAccepted(t *testing.T) {
	for _, o := range []string{
		"app.example.com",
		"HTTPS://App.Example.com",
		"https://app.example.com/mcp",
		"https://app.example.com:443",
		"*",
		"ftp://app.example.com",
	} {
		t.Run(o, func(t *testing.T) {
			if _, err := loadCaddyfile(t, "toolgate {\n allowed_origins "+o+"\n}"); err == nil {
				t.Errorf("allowed_origins %s accepted, but no browser ever sends that Origin; want an error naming allowed_origins and the form scheme://host[:port]", o)
			}
		})
	}
}

// Attack (fixed): a service url with a fragment (`https://up.example.com/mcp#x`)
// loads; the fragment is never sent, so what the administrator wrote is
// not where toolgate goes, and the Endpoint digest differs from the same
// URL without it (ending MCP sessions across a cosmetic edit).
// Fixed: a service url with a fragment is refused: `service "s": url: must not have a fragment (#…)`.
func TestAttackServiceURLFragmentAccepted(t *testing.T) {
	_, err := loadCaddyfile(t, "toolgate {\n service s {\n url https://up.example.com/mcp#tools\n tools t\n }\n}")
	if err == nil {
		t.Error("service url with a #fragment accepted: want `service \"s\": url: must not have a fragment`")
	}
}

// Attack (fixed): public_url with a query, a fragment or a user:password loads;
// redirect URIs and metadata are made by appending paths to it, giving
// https://gw.example.com?x=1/v1/connections/s/callback, or a fragment that
// swallows the path, or the password published in the protected-resource
// metadata.
// Fixed: Validate refuses a public_url with a user, password, query or fragment (scheme://host[:port][/path] only), quoting it redacted.
func TestAttackPublicURLQueryFragmentUserinfoAccepted(t *testing.T) {
	for _, u := range []string{
		"https://gw.example.com?tenant=1",
		"https://gw.example.com#top",
		"https://admin:hunter2@gw.example.com",
	} {
		t.Run(u, func(t *testing.T) {
			_, err := loadCaddyfile(t, "toolgate {\n public_url "+u+"\n}")
			if err == nil {
				t.Errorf("public_url %s accepted: want scheme://host[:port][/path] only", u)
				return
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error quotes the password: %v", err)
			}
		})
	}
}

// Attack (fixed): `state_secret abc` (3 bytes) loads when no service uses oauth and
// no console uses oidc. README: "(at least 32 bytes each)". The secret
// keys the seals of Mcp-Session-Ids, tasks and requestState, so a short
// one can be guessed offline and those values forged. (A short *previous*
// secret is refused.)
// Fixed: Validate refuses any state_secret under 32 bytes, without quoting it.
func TestAttackShortStateSecretAccepted(t *testing.T) {
	_, err := loadCaddyfile(t, "toolgate {\n state_secret abc\n}")
	if err == nil {
		t.Error("state_secret of 3 bytes accepted: want `state_secret: at least 32 bytes`")
	}
}

// Attack (fixed): `state_secret {env.TOOLGATE_STATE_SECRET}` with the variable
// unset loads: the secret silently becomes "none", MCP session ids are
// sealed with a per-process key, and replicas (and a restart) drop each
// other's sessions. The oauth path says "is its environment variable
// set?"; this one says nothing.
// Fixed: a state_secret that is empty once placeholders are replaced is refused at provision: "(is its environment variable set?)".
func TestAttackStateSecretEmptyAfterExpansionAccepted(t *testing.T) {
	t.Setenv("TG_ADVERSARIAL_UNSET_SECRET", "")
	app, err := loadCaddyfile(t, "toolgate {\n state_secret {env.TG_ADVERSARIAL_UNSET_SECRET}\n}")
	if err == nil {
		t.Errorf("state_secret that expands to %q accepted: want `state_secret is empty once placeholders are replaced (is its environment variable set?)`", app.StateSecret)
	}
}

// Attack (fixed): `transport` given twice in a service block: `transport http`
// then `transport sse` silently makes the service an SSE one (the second
// wins), and `transport sse` twice is accepted; every other option is
// refused when given twice.
// Fixed: `transport` given twice in a service block is refused while parsing: `service "s": transport given twice`.
func TestAttackServiceTransportGivenTwice(t *testing.T) {
	for _, body := range []string{
		"transport http\n transport sse",
		"transport sse\n transport sse",
		"transport http\n transport http",
	} {
		t.Run(strings.ReplaceAll(body, "\n ", "; "), func(t *testing.T) {
			app, err := unmarshal("toolgate {\n service s {\n url https://up.example.com/sse\n tools t\n " + body + "\n }\n}")
			if err == nil {
				t.Errorf("accepted (transport %s): want `service \"s\": transport given twice`", app.Services[0].TransportRaw)
			}
		})
	}
}

// Attack (fixed): `auth header` takes any header name and value: a name with a
// space, or a value holding CR LF (from an environment variable), loads,
// and then every call to the service fails at the HTTP client instead of
// the config being refused.
// Fixed: auth header needs a token header name and a value without control characters; the refusal quotes neither value nor name.
func TestAttackAuthHeaderNotValidated(t *testing.T) {
	t.Setenv("TG_ADVERSARIAL_HEADER_VALUE", "k1\r\nX-Injected: 1")
	for name, auth := range map[string]string{
		"name with space": `auth header "X Api Key" k1`,
		"name with colon": `auth header "X-Key:" k1`,
		"value with CRLF": `auth header X-Key {env.TG_ADVERSARIAL_HEADER_VALUE}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := loadCaddyfile(t, "toolgate {\n service s {\n url https://up.example.com/mcp\n tools t\n "+auth+"\n }\n}")
			if err == nil {
				t.Errorf("%s accepted: want `service \"s\": auth: invalid header name/value`", auth)
			} else if strings.Contains(err.Error(), "k1") {
				t.Errorf("error quotes the header value: %v", err)
			}
		})
	}
}

// Attack (fixed): the JSON config's extensions are never checked: a misspelled
// key (`require_sesion`) or a value of the wrong type
// (`"require_session": "true"`) loads, and impliedsession.Required reads
// it as false, so sessions stay implied: a protection the administrator
// asked for is off without a word.
// Fixed: an extension no capability registers is refused, and one whose parser declares its type (RegisterOption[T]) must decode into it strictly.
func TestAttackExtensionsNotValidated(t *testing.T) {
	for name, ext := range map[string]string{
		"misspelled key": `{"require_sesion": true}`,
		"string value":   `{"require_session": "true"}`,
		"tool_pins typo": `{"tool_pins": {"admin_group": ["secops"]}}`,
	} {
		t.Run(name, func(t *testing.T) {
			app, err := loadJSON(t, `{"extensions": `+ext+`}`)
			if err == nil {
				t.Errorf("extensions %s accepted (require_session in effect: %v): want an error naming the unknown option or its bad value", ext, impliedsession.Required(app))
			}
		})
	}
}

// Attack (fixed): session_header takes any name: one that is not an HTTP token
// ("X Session", which no client can send, so no explicit session ever
// works), or a header the protocol already uses (Authorization, which
// carries the caller's bearer token; Mcp-Session-Id; Origin), loads
// without a word.
// Fixed: session_header must be a header name that HTTP, MCP (Mcp-*), browsers (Sec-*, Proxy-*) and toolgate do not use already.
func TestAttackSessionHeaderNotValidated(t *testing.T) {
	for _, h := range []string{`"X Session"`, "Authorization", "Mcp-Session-Id", "Origin"} {
		t.Run(h, func(t *testing.T) {
			if _, err := loadCaddyfile(t, "toolgate {\n session_header "+h+"\n}"); err == nil {
				t.Errorf("session_header %s accepted: want a refusal (an HTTP header name that toolgate and MCP do not use already)", h)
			}
		})
	}
}

// Attack (fixed): absurd durations are accepted: `mcp_session_sweep_interval 1ns`
// makes the housekeeping loop sweep MCP sessions as fast as it can spin
// (a ticker of 1ns), and `cache_ttl 8760h` means, with a storage that does
// not announce changes, a session ended or a credential removed through
// another replica keeps working here for a year.
// Fixed: Validate refuses mcp_session_sweep_interval under 10ms and cache_ttl over 1h, saying the bound and the default.
func TestAttackAbsurdDurationsAccepted(t *testing.T) {
	for _, opt := range []string{"mcp_session_sweep_interval 1ns", "cache_ttl 8760h"} {
		t.Run(opt, func(t *testing.T) {
			if _, err := loadCaddyfile(t, "toolgate {\n "+opt+"\n}"); err == nil {
				t.Errorf("%s accepted: want a range (sweep >= 10ms, cache_ttl <= 1h) in the error", opt)
			}
		})
	}
}

// Holds: the same API key hash given for two users (Caddyfile api_key
// lines) is refused at Provision, naming both users, not the key.
func TestHoldsDuplicateAPIKeyRefused(t *testing.T) {
	_, err := loadCaddyfile(t, "toolgate {\n auth {\n api_key "+hashA+" alice\n api_key "+hashA+" bob\n }\n}")
	if err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Fatalf("duplicate key: %v", err)
	}
}

// Holds: duplicate service ids in JSON (which the Caddyfile adapter
// refuses itself) are refused at Provision.
func TestHoldsDuplicateServiceIDInJSONRefused(t *testing.T) {
	_, err := loadJSON(t, `{"services":[{"id":"s","url":"https://a.example.com/mcp","tools":["t"]},
		{"id":"s","url":"https://b.example.com/mcp","tools":["t"]}]}`)
	if err == nil || !strings.Contains(err.Error(), `service "s": defined twice`) {
		t.Fatalf("duplicate service id: %v", err)
	}
}

// Holds: service urls with schemes toolgate cannot use, credentials, no
// host, or plain http without allow_http are refused, naming the service
// and url, without repeating a password.
func TestHoldsServiceURLSchemesRefused(t *testing.T) {
	for _, u := range []string{
		"file:///etc/passwd",
		"javascript:alert(1)",
		"ftp://up.example.com/mcp",
		"https://user:s3cretpw@up.example.com/mcp",
		"http://up.example.com/mcp",
		"https://user:s3cretpw@up.example.com/%zz",
		"/relative/mcp",
	} {
		t.Run(u, func(t *testing.T) {
			_, err := loadCaddyfile(t, "toolgate {\n service s {\n url \""+u+"\"\n tools t\n }\n}")
			if err == nil {
				t.Fatalf("url %s accepted", u)
			}
			if !strings.Contains(err.Error(), `service "s": url`) || strings.Contains(err.Error(), "s3cretpw") {
				t.Errorf("error: %v", err)
			}
		})
	}
}

// Holds: negative sizes, counts and durations in JSON (the Caddyfile
// refuses them itself) are refused, and an absurd max_request_bytes whose
// defaults overflow int64 is refused rather than wrapping to "unlimited".
func TestHoldsNegativeAndOverflowingJSONRefused(t *testing.T) {
	for _, cfg := range []string{
		`{"max_request_bytes": -1}`,
		`{"max_response_bytes": -1}`,
		`{"max_json_depth": -1}`,
		`{"max_streams": -5}`,
		`{"max_sessions_per_user": -1}`,
		`{"session_ttl": -1}`,
		`{"cache_ttl": -1}`,
		`{"max_request_bytes": 4611686018427387904}`,
		`{"max_request_bytes": 2305843009213693952}`,
		`{"services":[{"id":"s","url":"https://a.example.com/mcp","tools":["t"],"timeout":-1}]}`,
		`{"services":[{"id":"s","url":"https://a.example.com/mcp","tools":["t"],"timeout":3600000000000}]}`,
		`{"services":[{"id":"s","url":"https://a.example.com/mcp","tools":["t"],"dial_timeout":-1}]}`,
		`{"services":[{"id":"s","url":"https://a.example.com/mcp","tools":["t"],"resume_attempts":-1}]}`,
	} {
		t.Run(cfg, func(t *testing.T) {
			_, err := loadJSON(t, cfg)
			if err == nil {
				t.Errorf("%s accepted", cfg)
			}
			t.Log(err)
		})
	}
}

// Holds: an oauth service whose token_url is bad is refused with a message
// that names the field and never the client secret; the refusal for a
// missing cipher names the service.
func TestHoldsOAuthErrorsQuoteNoSecret(t *testing.T) {
	_, err := loadCaddyfile(t, `toolgate {
		public_url https://gw.example.com
		state_secret 0123456789abcdef0123456789abcdef
		cipher local `+t.TempDir()+`/key
		service s {
			url https://up.example.com/mcp
			tools t
			auth oauth {
				authorization_url https://auth.example.com/authorize
				token_url ftp://tok:pw-in-url@auth.example.com/token
				client_id c
				client_secret topsecret-client-value
			}
		}
	}`)
	if err == nil {
		t.Fatal("ftp token_url accepted")
	}
	if !strings.Contains(err.Error(), "token_url") || strings.Contains(err.Error(), "topsecret") || strings.Contains(err.Error(), "pw-in-url") {
		t.Errorf("error: %v", err)
	}
}

// Holds: case variants of keywords are refused, not folded: `auth BEARER`,
// `sse_keepalive OFF`, `transport SSE`, `tool t READ_ONLY`.
func TestHoldsKeywordCaseVariantsRefused(t *testing.T) {
	for _, body := range []string{"auth BEARER", "sse_keepalive OFF", "transport SSE", "tool t READ_ONLY"} {
		t.Run(body, func(t *testing.T) {
			_, err := loadCaddyfile(t, "toolgate {\n service s {\n url https://up.example.com/mcp\n tools t\n "+body+"\n }\n}")
			if err == nil {
				t.Errorf("%s accepted", body)
			}
		})
	}
}
