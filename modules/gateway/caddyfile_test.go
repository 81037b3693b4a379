package gateway_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/filestorage"

	_ "github.com/toolgate/toolgate/modules/ciphers/local"
	"github.com/toolgate/toolgate/modules/gateway"
)

const (
	hashA = "sha256:c3fe0b469a6d4f19a25fbec114762d2186aa2c22888f52c5550a77fc104bcff3"
	hashB = "sha256:cfdd601be826835d6a59c993254eb5786da08ee32379b680795ebe708f0060f9"
)

func unmarshal(input string) (*gateway.App, error) {
	app := new(gateway.App)
	err := app.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
	return app, err
}

func TestUnmarshalCaddyfileFullOptionSet(t *testing.T) {
	app, err := unmarshal(`toolgate {
		public_url   https://gateway.example.com
		state_secret {env.TOOLGATE_STATE_SECRET}
		storage file_system /var/lib/toolgate
		cipher local {
			key_file /etc/toolgate/cipher.key
		}
		session_header X-Run-Session
		session_ttl    2h
		max_sessions_per_user 20
		mcp_session_idle_timeout 30m
		mcp_session_sweep_interval 15s
		max_mcp_sessions 500
		max_mcp_sessions_per_caller 7
		max_streams 900
		max_streams_per_caller 90
		cache_ttl      5s
		allowed_origins https://a.example.com https://b.example.com:8443
		max_request_size  1MiB
		max_response_size 32MB
		max_json_depth    32
		max_request_values 5000
		max_response_values 60000
		max_request_bytes_in_flight 512MiB
		max_request_bytes_in_flight_per_caller 8MiB
		auth {
			api_key ` + hashA + ` alice@example.com eng ops
			api_key ` + hashB + ` bob@example.com
			api_keys {env.KEYS_FILE}
			jwt {
				issuer       https://idp.example.com
				audience     https://gateway.example.com toolgate
				jwks_url     https://idp.example.com/.well-known/jwks.json
				key_file     /etc/toolgate/idp-1.pem
				key_file     /etc/toolgate/idp-2.pem
				user_claim   email
				groups_claim roles
				leeway       1m
			}
			jwt {
				issuer   https://other.example.com
				audience gw
				key_file /etc/other.pem
			}
			scopes    openid mcp:tools
			anonymous dev@localhost
		}
		service tracker {
			title         "Work tracker"
			url           https://tracker.example.com/mcp
			tools         whoami read_ticket delete_ticket
			tool          read_ticket read_only
			tool          delete_ticket destructive
			allowed_users alice@example.com bob@example.com
			timeout       90s
			dial_timeout  2s
			response_header_timeout 20s
			resume_attempts  3
			max_resume_delay 10s
			sse_keepalive    5s
			auth oauth {
				authorization_url https://auth.example.com/authorize
				token_url         https://auth.example.com/token
				revocation_url    https://auth.example.com/revoke
				client_id         toolgate
				client_secret     {env.TRACKER_CLIENT_SECRET}
				scopes            tickets.read tickets.write
				resource          https://tracker.example.com/mcp
				refresh_skew      2m
				login_hint
			}
		}
		service search {
			url   https://search.example.com/mcp
			tools query
			auth  bearer
			sse_keepalive off
		}
		service weather {
			url   http://127.0.0.1:9000/mcp
			allow_http
			tools forecast
			auth  header X-API-Key {env.WEATHER_KEY}
		}
		service open {
			url   https://open.example.com/mcp
			tools ping
			auth  none
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}

	// Scalars.
	for _, c := range []struct{ name, got, want string }{
		{"PublicURL", app.PublicURL, "https://gateway.example.com"},
		{"StateSecret", app.StateSecret, "{env.TOOLGATE_STATE_SECRET}"}, // expanded at Provision, not while parsing
		{"SessionHeader", app.SessionHeader, "X-Run-Session"},
		{"Auth.APIKeysFile", app.Auth.APIKeysFile, "{env.KEYS_FILE}"},
		{"Auth.Anonymous", app.Auth.Anonymous, "dev@localhost"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
	durations := []struct {
		name      string
		got, want caddy.Duration
	}{
		{"SessionTTL", app.SessionTTL, caddy.Duration(2 * time.Hour)},
		{"MCPSessionIdleTimeout", app.MCPSessionIdleTimeout, caddy.Duration(30 * time.Minute)},
		{"MCPSessionSweepInterval", app.MCPSessionSweepInterval, caddy.Duration(15 * time.Second)},
		{"CacheTTL", app.CacheTTL, caddy.Duration(5 * time.Second)},
	}
	for _, c := range durations {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, time.Duration(c.got), time.Duration(c.want))
		}
	}
	if app.MaxSessionsPerUser != 20 {
		t.Errorf("MaxSessionsPerUser = %d, want 20", app.MaxSessionsPerUser)
	}
	if app.MaxMCPSessions != 500 || app.MaxMCPSessionsPerCaller != 7 {
		t.Errorf("MCP session limits = %d, %d; want 500, 7", app.MaxMCPSessions, app.MaxMCPSessionsPerCaller)
	}
	if app.MaxStreams != 900 || app.MaxStreamsPerCaller != 90 {
		t.Errorf("stream limits = %d, %d; want 900, 90", app.MaxStreams, app.MaxStreamsPerCaller)
	}
	if app.MaxRequestBytesInFlight != 512<<20 || app.MaxRequestBytesInFlightPerCaller != 8<<20 {
		t.Errorf("request bytes in flight = %d, %d per caller", app.MaxRequestBytesInFlight, app.MaxRequestBytesInFlightPerCaller)
	}
	if app.MaxRequestBytes != 1<<20 || app.MaxResponseBytes != 32_000_000 || app.MaxJSONDepth != 32 || app.MaxRequestValues != 5000 || app.MaxResponseValues != 60000 {
		t.Errorf("sizes = %d, %d, %d, %d, %d; want %d, %d, 32, 5000, 60000", app.MaxRequestBytes, app.MaxResponseBytes, app.MaxJSONDepth,
			app.MaxRequestValues, app.MaxResponseValues, 1<<20, 32_000_000)
	}
	assertJSON(t, "AllowedOrigins", app.AllowedOrigins, `["https://a.example.com","https://b.example.com:8443"]`)

	// Guest modules are JSON with their inline key.
	assertJSON(t, "StorageRaw", app.StorageRaw, `{"module":"file_system","root":"/var/lib/toolgate"}`)
	assertJSON(t, "CipherRaw", app.CipherRaw, `{"cipher":"local","key_file":"/etc/toolgate/cipher.key"}`)

	// auth.
	assertJSON(t, "Auth.APIKeys", app.Auth.APIKeys, `[
		{"hash":"`+hashA+`","user":"alice@example.com","groups":["eng","ops"]},
		{"hash":"`+hashB+`","user":"bob@example.com"}]`)
	assertJSON(t, "Auth.JWT", app.Auth.JWT, `[
		{"issuer":"https://idp.example.com","audience":["https://gateway.example.com","toolgate"],
		 "jwks_url":"https://idp.example.com/.well-known/jwks.json",
		 "key_files":["/etc/toolgate/idp-1.pem","/etc/toolgate/idp-2.pem"],
		 "user_claim":"email","groups_claim":"roles","leeway":60000000000},
		{"issuer":"https://other.example.com","audience":["gw"],"key_files":["/etc/other.pem"]}]`)

	assertJSON(t, "Auth.Scopes", app.Auth.Scopes, `["openid","mcp:tools"]`)

	// services, in order.
	assertJSON(t, "Services", app.Services, `[
		{"id":"tracker","title":"Work tracker","url":"https://tracker.example.com/mcp",
		 "tools":["whoami","read_ticket","delete_ticket"],
		 "tool_effects":{"read_ticket":"read_only","delete_ticket":"destructive"},
		 "allowed_users":["alice@example.com","bob@example.com"],
		 "timeout":90000000000,"dial_timeout":2000000000,"response_header_timeout":20000000000,
		 "resume_attempts":3,"max_resume_delay":10000000000,"sse_keepalive":5000000000,
		 "auth":{"kind":"oauth","oauth":{
			"authorization_url":"https://auth.example.com/authorize","token_url":"https://auth.example.com/token",
			"revocation_url":"https://auth.example.com/revoke","client_id":"toolgate","client_secret":"{env.TRACKER_CLIENT_SECRET}",
			"scopes":["tickets.read","tickets.write"],"resource":"https://tracker.example.com/mcp",
			"refresh_skew":120000000000,"login_hint":true}}},
		{"id":"search","url":"https://search.example.com/mcp","tools":["query"],"sse_keepalive":-1,"auth":{"kind":"bearer"}},
		{"id":"weather","url":"http://127.0.0.1:9000/mcp","allow_http":true,"tools":["forecast"],
		 "auth":{"kind":"header","header":"X-API-Key","value":"{env.WEATHER_KEY}"}},
		{"id":"open","url":"https://open.example.com/mcp","tools":["ping"],"auth":{"kind":"none"}}]`)
}

func TestUnmarshalCaddyfileMinimal(t *testing.T) {
	for _, input := range []string{`toolgate`, `toolgate { }`, "toolgate {\n}"} {
		app, err := unmarshal(input)
		if err != nil {
			t.Errorf("%q: %v", input, err)
			continue
		}
		if b, _ := json.Marshal(app); string(b) != `{}` {
			t.Errorf("%q: got %s, want an empty app (defaults are applied at Provision)", input, b)
		}
	}
}

// state_secret's further arguments are the secrets it replaced, kept to
// open what they sealed.
func TestUnmarshalCaddyfileStateSecretRotation(t *testing.T) {
	app, err := unmarshal(`toolgate {
		state_secret {env.NEW_SECRET} {env.OLD_SECRET} {env.OLDER_SECRET}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(app)
	if want := `{"state_secret":"{env.NEW_SECRET}","previous_state_secrets":["{env.OLD_SECRET}","{env.OLDER_SECRET}"]}`; string(b) != want {
		t.Errorf("got %s, want %s", b, want)
	}
	app, err = unmarshal("toolgate {\n state_secret {env.ONLY}\n}")
	if b, _ := json.Marshal(app); err != nil || string(b) != `{"state_secret":"{env.ONLY}"}` {
		t.Errorf("one secret: %s, %v", b, err)
	}
}

func TestUnmarshalCaddyfileCipherArgumentAndStorageBlock(t *testing.T) {
	app, err := unmarshal(`toolgate {
		cipher local /k
		storage file_system {
			root /srv/state
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	assertJSON(t, "CipherRaw", app.CipherRaw, `{"cipher":"local","key_file":"/k"}`)
	assertJSON(t, "StorageRaw", app.StorageRaw, `{"module":"file_system","root":"/srv/state"}`)
}

func TestUnmarshalCaddyfileErrors(t *testing.T) {
	svc := func(body string) string {
		return "toolgate {\n service s {\n url https://s.example.com/mcp\n tools t\n" + body + "\n }\n}"
	}
	authBlock := func(body string) string { return "toolgate {\n auth {\n" + body + "\n }\n}" }
	jwtBlock := func(body string) string {
		return authBlock(" jwt {\n issuer https://i\n" + body + "\n }")
	}
	oauth := func(body string) string { return svc("auth oauth {\n client_id c\n" + body + "\n }") }
	tests := []struct {
		name  string
		input string
		want  string // substring of the error
	}{
		// toolgate level.
		{"argument after toolgate", `toolgate extra`, "wrong argument count"},
		{"unknown option", "toolgate {\n bogus 1\n}", `toolgate: unknown option "bogus"`},
		{"duplicate public_url", "toolgate {\n public_url https://a\n public_url https://b\n}", "public_url given twice"},
		{"duplicate auth", "toolgate {\n auth {\n }\n auth {\n }\n}", "auth given twice"},
		{"duplicate storage", "toolgate {\n storage file_system /a\n storage file_system /b\n}", "storage given twice"},
		{"duplicate allowed_origins", "toolgate {\n allowed_origins a\n allowed_origins b\n}", "allowed_origins given twice"},
		{"public_url without argument", "toolgate {\n public_url\n}", "wrong argument count"},
		{"public_url with two arguments", "toolgate {\n public_url a b\n}", "wrong argument count"},
		{"state_secret without argument", "toolgate {\n state_secret\n}", "wrong argument count"},
		{"duplicate state_secret", "toolgate {\n state_secret a b\n state_secret c\n}", "state_secret given twice"},
		{"allowed_origins without argument", "toolgate {\n allowed_origins\n}", "wrong argument count"},
		{"storage without module", "toolgate {\n storage\n}", "wrong argument count"},
		{"unknown cipher module", "toolgate {\n cipher rot13\n}", "rot13"},
		{"unknown storage module", "toolgate {\n storage floppy\n}", "floppy"},
		{"bad session_ttl", "toolgate {\n session_ttl soon\n}", `session_ttl: invalid duration "soon"`},
		{"negative cache_ttl", "toolgate {\n cache_ttl -1s\n}", `cache_ttl: invalid duration "-1s": must be positive`},
		{"zero idle timeout", "toolgate {\n mcp_session_idle_timeout 0s\n}", `mcp_session_idle_timeout: invalid duration "0s"`},
		{"session_ttl without argument", "toolgate {\n session_ttl\n}", "wrong argument count"},
		{"bad size", "toolgate {\n max_request_size lots\n}", `max_request_size: invalid size "lots"`},
		{"bad size in flight", "toolgate {\n max_request_bytes_in_flight 0\n}", `max_request_bytes_in_flight: invalid size "0"`},
		{"zero size", "toolgate {\n max_response_size 0\n}", `invalid size "0"`},
		{"size over 1TiB", "toolgate {\n max_response_size 2TiB\n}", `invalid size "2TiB"`},
		{"zero depth", "toolgate {\n max_json_depth 0\n}", `max_json_depth: "0" is not a positive integer`},
		{"zero sessions per user", "toolgate {\n max_sessions_per_user 0\n}", `max_sessions_per_user: "0" is not a positive integer`},
		{"negative depth", "toolgate {\n max_json_depth -3\n}", `max_json_depth: "-3" is not a positive integer`},
		{"word depth", "toolgate {\n max_json_depth deep\n}", `max_json_depth: "deep" is not a positive integer`},
		{"zero values", "toolgate {\n max_request_values 0\n}", `max_request_values: "0" is not a positive integer`},
		{"zero sessions", "toolgate {\n max_mcp_sessions 0\n}", `max_mcp_sessions: "0" is not a positive integer`},
		{"per-caller sessions without a number", "toolgate {\n max_mcp_sessions_per_caller\n}", "wrong argument count"},
		{"zero streams", "toolgate {\n max_streams_per_caller 0\n}", `max_streams_per_caller: "0" is not a positive integer`},
		{"bad sweep interval", "toolgate {\n mcp_session_sweep_interval often\n}", `mcp_session_sweep_interval: invalid duration "often"`},
		{"bad dial_timeout", svc("dial_timeout -1s"), `dial_timeout: invalid duration "-1s": must be positive`},
		{"bad response_header_timeout", svc("response_header_timeout never"), `response_header_timeout: invalid duration "never"`},
		{"zero resume_attempts", svc("resume_attempts 0"), `resume_attempts: "0" is not a positive integer`},
		{"bad max_resume_delay", svc("max_resume_delay 0s"), `max_resume_delay: invalid duration "0s"`},
		{"bad sse_keepalive", svc("sse_keepalive sometimes"), `sse_keepalive: "sometimes" is neither a positive duration nor off`},
		{"sse_keepalive twice", svc("sse_keepalive off\n sse_keepalive 1s"), "sse_keepalive given twice"},

		// auth level.
		{"auth with an argument", "toolgate {\n auth jwt\n}", "wrong argument count"},
		{"auth unknown option", authBlock("oidc x"), `auth: unknown option "oidc"`},
		{"api_key with only a hash", authBlock("api_key " + hashA), "auth api_key: want <sha256:hex> <user>"},
		{"api_key alone", authBlock("api_key"), "auth api_key: want"},
		{"api_keys twice", authBlock("api_keys /a\n api_keys /b"), "auth: api_keys given twice"},
		{"api_keys without file", authBlock("api_keys"), "wrong argument count"},
		{"anonymous twice", authBlock("anonymous a\n anonymous b"), "auth: anonymous given twice"},
		{"anonymous without user", authBlock("anonymous"), "wrong argument count"},
		{"scopes twice", authBlock("scopes a\n scopes b"), "auth: scopes given twice"},
		{"scopes without a scope", authBlock("scopes"), "wrong argument count"},
		{"jwt with an argument", authBlock("jwt https://i"), "wrong argument count"},
		{"jwt unknown option", jwtBlock("algorithm RS256"), `auth jwt: unknown option "algorithm"`},
		{"jwt issuer twice", jwtBlock("issuer https://j"), "auth jwt: issuer given twice"},
		{"jwt audience without value", jwtBlock("audience"), "wrong argument count"},
		{"jwt jwks_url twice", jwtBlock("jwks_url https://a\n jwks_url https://b"), "auth jwt: jwks_url given twice"},
		{"jwt bad leeway", jwtBlock("leeway a-bit"), `leeway: invalid duration "a-bit"`},
		{"jwt key_file without path", jwtBlock("key_file"), "wrong argument count"},

		// service level.
		{"service without id", "toolgate {\n service {\n url https://x\n }\n}", "service: want an id"},
		{"service with two ids", "toolgate {\n service a b\n}", "wrong argument count"},
		{"service defined twice", "toolgate {\n service a {\n tools t\n }\n service a {\n tools u\n }\n}", `service "a" defined twice`},
		{"service unknown option", svc("retries 3"), `service "s": unknown option "retries"`},
		{"service url twice", svc("url https://other"), `service "s": url given twice`},
		{"service tools twice", svc("tools u"), `service "s": tools given twice`},
		{"service tools empty", "toolgate {\n service s {\n tools\n }\n}", `service "s": tools: list at least one tool`},
		{"service allow_http with argument", svc("allow_http yes"), "wrong argument count"},
		{"service allowed_users empty", svc("allowed_users"), "wrong argument count"},
		{"service bad timeout", svc("timeout forever"), `timeout: invalid duration "forever"`},
		{"service title without text", svc("title"), "wrong argument count"},
		{"service tool without effect", svc("tool t"), `service "s": tool: want <name> read_only|additive|destructive`},
		{"service tool with two effects", svc("tool t read_only destructive"), `service "s": tool: want <name>`},
		{"service tool declared twice", svc("tool t read_only\n tool t additive"), `service "s": tool t declared twice`},

		// service auth.
		{"auth without kind", svc("auth"), `service "s": auth: want none, bearer, header`},
		{"auth unknown kind", svc("auth basic"), `service "s": auth: unknown kind "basic"`},
		{"auth twice", svc("auth none\n auth bearer"), `service "s": auth given twice`},
		{"auth bearer with argument", svc("auth bearer tok"), "wrong argument count"},
		{"auth none with argument", svc("auth none x"), "wrong argument count"},
		{"auth header with one argument", svc("auth header X-Key"), `service "s": auth header: want <name> <value>`},
		{"auth header with three arguments", svc("auth header X-Key a b"), `service "s": auth header: want <name> <value>`},
		{"auth oauth with argument", svc("auth oauth github {\n }"), "wrong argument count"},
		{"oauth unknown option", oauth("pkce off"), `service "s": auth oauth: unknown option "pkce"`},
		{"oauth client_id twice", oauth("client_id d"), `service "s": auth oauth: client_id given twice`},
		{"oauth scopes empty", oauth("scopes"), "wrong argument count"},
		{"oauth token_url without value", oauth("token_url"), "wrong argument count"},
		{"oauth bad refresh_skew", oauth("refresh_skew early"), `refresh_skew: invalid duration "early"`},
		{"oauth login_hint with argument", oauth("login_hint alice"), "wrong argument count"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := unmarshal(tt.input)
			if err == nil {
				t.Fatalf("accepted:\n%s", tt.input)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q\ndoes not contain %q", err, tt.want)
			}
		})
	}
}

// assertJSON compares the JSON encoding of got with want, ignoring layout.
func assertJSON(t *testing.T, name string, got any, want string) {
	t.Helper()
	var g, w any
	gb, err := json.Marshal(got)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := json.Unmarshal(gb, &g); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("%s: bad expectation: %v", name, err)
	}
	gn, _ := json.Marshal(g)
	wn, _ := json.Marshal(w)
	if string(gn) != string(wn) {
		t.Errorf("%s =\n%s\nwant\n%s", name, gn, wn)
	}
}

// FuzzUnmarshalCaddyfile parses arbitrary toolgate blocks, service blocks
// included: an operator's typo must give an error that says something,
// never a panic; a block that parses gives the same JSON config every
// time (what the Caddyfile adapter hands Caddy).
func FuzzUnmarshalCaddyfile(f *testing.F) {
	for _, seed := range []string{
		"toolgate {\n}",
		"toolgate {\n public_url https://gw\n session_ttl 2h\n}",
		"toolgate {\n service s {\n url https://u\n tools a b\n auth oauth {\n client_id c\n }\n }\n}",
		"toolgate {\n auth {\n jwt {\n issuer i\n audience a\n }\n api_key sha256:00 u g\n }\n}",
		"toolgate {\n service {\n}",
		"toolgate {\n max_json_depth -1\n}",
		"toolgate {\n service s {\n title \"A b\"\n url http://u/mcp\n allow_http\n tool t read_only\n pin t sha256:00\n allowed_users a b\n timeout 1s\n dial_timeout 1s\n response_header_timeout 1s\n resume_attempts 2\n max_resume_delay 1s\n sse_keepalive off\n auth header X-K v\n }\n}",
		"toolgate {\n service s {\n command /bin/prog -x\n env A b\n env A c\n per_user\n credential_env T\n idle_timeout off\n limits {\n memory 1MiB\n open_files 5\n }\n }\n}",
		"toolgate {\n service s {\n url https://u\n transport sse\n auth oauth {\n authorization_url https://p/a\n token_url https://p/t\n client_id c\n client_secret {env.S}\n scopes a b\n resource https://u\n refresh_skew 1m\n login_hint\n }\n }\n service s {\n url https://v\n }\n}",
		"toolgate {\n max_request_size 1MiB\n max_response_size 1x\n allowed_origins https://a.example:8443 *\n cipher local {\n key_file /k\n }\n storage file_system /d\n}",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, input string) {
		app, err := unmarshal(input)
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatalf("an empty error for %q", input)
			}
			return
		}
		first, err := json.Marshal(app)
		if err != nil {
			t.Fatalf("%q parsed into a config that is not JSON: %v", input, err)
		}
		again, err := unmarshal(input)
		if err != nil {
			t.Fatalf("%q parsed once, then failed: %v", input, err)
		}
		if second, _ := json.Marshal(again); string(second) != string(first) {
			t.Fatalf("%q parsed into two configs:\n%s\n%s", input, first, second)
		}
	})
}
