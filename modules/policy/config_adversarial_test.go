package policy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/filestorage"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	_ "github.com/toolgate/toolgate/modules/registry"
	_ "github.com/toolgate/toolgate/modules/session"
)

// repoPolicies is the repository's policy directory, a source that
// compiles.
var repoPolicies, _ = filepath.Abs("../../policies")

// caddyValidate runs what `caddy validate` runs (every module provisioned
// and validated, nothing started) on a config whose one route is
// toolgate_session, toolgate_registry and then handler, the JSON of a
// policy handler.
func caddyValidate(t *testing.T, handler string) error {
	t.Helper()
	storage, _ := json.Marshal(map[string]string{"module": "file_system", "root": t.TempDir()})
	config := `{
		"admin": {"disabled": true},
		"storage": ` + string(storage) + `,
		"apps": {
			"toolgate": {"storage": ` + string(storage) + `},
			"http": {"servers": {"s": {
				"listen": ["127.0.0.1:0"],
				"automatic_https": {"disable": true},
				"routes": [{"handle": [
					{"handler": "toolgate_session"},
					{"handler": "toolgate_registry"},
					` + handler + `
				]}]
			}}}
		}
	}`
	var cfg caddy.Config
	if err := json.Unmarshal([]byte(config), &cfg); err != nil {
		t.Fatalf("config does not decode: %v", err)
	}
	return caddy.Validate(&cfg)
}

func quoted(s string) string { b, _ := json.Marshal(s); return string(b) }

// Attack (fixed): in JSON, toolgate_policy's approval_wait is not bounded: 24h (and
// a negative value) pass `caddy validate`, although the README and the
// Caddyfile say "at most 1h". A call is then held open, with its stream,
// goroutine and upstream connection, for a day.
// Fixed: Config.validate bounds approval_wait (0 to 1h) whatever the configuration's form.
func TestAttackApprovalWaitUnboundedInJSON(t *testing.T) {
	for _, wait := range []string{"86400000000000", "-1"} {
		t.Run(wait, func(t *testing.T) {
			err := caddyValidate(t, `{"handler": "toolgate_policy", "source": `+quoted(repoPolicies)+`, "approval_wait": `+wait+`}`)
			if err == nil {
				t.Errorf("approval_wait %sns passes caddy validate: want `request: approval_wait must be positive and at most 1h0m0s`", wait)
			}
		})
	}
}

// Attack (fixed): in JSON, toolgate_result_policy takes approval_wait and ignores
// it; the Caddyfile refuses the same thing ("approval_wait belongs to
// toolgate_policy"), so the administrator who wrote JSON believes results
// wait for approvals while nothing does.
// Fixed: Config.validate refuses approval_wait on the result stage.
func TestAttackResultPolicyApprovalWaitSilentlyIgnored(t *testing.T) {
	err := caddyValidate(t, `{"handler": "toolgate_result_policy", "source": `+quoted(repoPolicies)+`, "approval_wait": 60000000000}`)
	if err == nil {
		t.Error("toolgate_result_policy with approval_wait passes caddy validate: want `result: approval_wait belongs to toolgate_policy`")
	}
}

// Attack (fixed): a policy bundle fetched over plain http from a remote host
// (`toolgate_policy http://bundles.example.com/toolgate.tar.gz`) passes
// `caddy validate`: anyone on the path can serve an allow-everything
// bundle, and the gateway enforces it. Compare kms `endpoint`: http only
// on a loopback address.
// Fixed: checkSource refuses an http:// bundle URL to a host that is not a loopback address.
func TestAttackPolicyBundleOverPlainHTTP(t *testing.T) {
	err := caddyValidate(t, `{"handler": "toolgate_policy", "source": "http://bundles.example.com/toolgate.tar.gz"}`)
	if err == nil {
		t.Error("a bundle over plain http from a remote host passes caddy validate: want `request: source: a bundle URL must be https (http only on a loopback address)`")
	}
}

// Attack (fixed): a bundle URL that carries a password
// (https://toolgate:<password>@bundles.example.com/b.tar.gz, basic auth
// being the usual way to protect a bundle server) is logged verbatim in
// the `source` field of every failed reload (every 30 s while the server
// fails) and of every "policy reloaded" line. The gateway redacts the same
// in jwks_url (caddyopt.RedactURL); the policy module does not.
// Fixed: bundleSource.String hides the URL's userinfo and query.
func TestAttackBundlePasswordLogged(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	const password = "bundle-pw-7f3a"
	url := strings.Replace(srv.URL, "http://", "http://toolgate:"+password+"@", 1) + "/toolgate.tar.gz"
	core, logs := observer.New(zapcore.DebugLevel)
	e, err := newEngine(newSource(url), "data.toolgate.request.decision", stageRequest, evaluatorPlan, 0, zap.New(core), policyMetrics)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Destruct()
	e.reloadAndReport()
	if logs.Len() == 0 {
		t.Fatal("the failed reload logged nothing")
	}
	for _, entry := range logs.All() {
		for k, v := range entry.ContextMap() {
			if s, ok := v.(string); ok && strings.Contains(s, password) {
				t.Errorf("log %q: field %s holds the bundle password: %s", entry.Message, k, s)
			}
		}
	}
}

// Attack (fixed): a bundle URL whose scheme is not exactly "http://" or
// "https://" (`HTTPS://…`, `ftp://…`) is read as a relative file path
// (<cwd>/HTTPS:/…); the refusal says a file is missing, not that the URL's
// scheme is wrong or which schemes are allowed, and quotes the URL's
// password, since it is taken for a path.
// Fixed: a scheme is read in any case (`HTTPS://` is a bundle URL, and
// hides its password when named), and a URL of another scheme is refused
// saying which are allowed, without its password.
func TestAttackBundleSchemeVariantReadAsFilePath(t *testing.T) {
	for _, u := range []string{
		"HTTPS://bundles.example.com/toolgate.tar.gz",
		"Https://toolgate:bundle-pw-7f3a@bundles.example.com/toolgate.tar.gz",
	} {
		if src := newSource(u); !src.remote() || strings.Contains(src.String(), "bundle-pw-7f3a") {
			t.Errorf("%s: taken for a file path, or named with its password: %s", u, src)
		}
		if err := caddyValidate(t, `{"handler": "toolgate_policy", "source": `+quoted(u)+`}`); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
	for _, u := range []string{
		"ftp://bundles.example.com/toolgate.tar.gz",
		"ftp://toolgate:bundle-pw-7f3a@bundles.example.com/toolgate.tar.gz",
	} {
		t.Run(u, func(t *testing.T) {
			err := caddyValidate(t, `{"handler": "toolgate_policy", "source": `+quoted(u)+`}`)
			if err == nil {
				t.Fatalf("%s passes caddy validate", u)
			}
			if !strings.Contains(err.Error(), "scheme") && !strings.Contains(err.Error(), "https://") {
				t.Errorf("%s: the refusal does not say the URL's scheme is wrong: %v", u, err)
			}
			if strings.Contains(err.Error(), "bundle-pw-7f3a") {
				t.Errorf("%s: the refusal quotes the password", u)
			}
		})
	}
}

// Holds: the Caddyfile bounds approval_wait (1h), refuses it in
// toolgate_result_policy, refuses an option or the source given twice,
// case variants of evaluator, and zero or negative durations.
func TestHoldsPolicyCaddyfileRefusals(t *testing.T) {
	for input, want := range map[string]string{
		"toolgate_policy p {\n approval_wait 2h\n}":                   `invalid approval_wait "2h" (a duration up to 1h0m0s)`,
		"toolgate_policy p {\n approval_wait 0s\n}":                   `invalid approval_wait "0s"`,
		"toolgate_result_policy p {\n approval_wait 1m\n}":            "approval_wait belongs to toolgate_policy",
		"toolgate_policy p {\n timeout 1s\n timeout 2s\n}":            "timeout given twice",
		"toolgate_policy p {\n source q\n}":                           "the source is given twice",
		"toolgate_policy p {\n evaluator PLAN\n}":                     `invalid evaluator "PLAN"`,
		"toolgate_policy p {\n timeout -1s\n}":                        `invalid timeout "-1s"`,
		"toolgate_policy p {\n reload_interval 0s\n}":                 `invalid reload_interval "0s"`,
		"toolgate_policy p {\n reload_interval OFF\n}":                `invalid reload_interval "OFF"`,
		"toolgate_policy p {\n log_payloads yes\n}":                   "wrong argument count",
		"toolgate_policy p {\n mask /arguments/password\n}":           `unknown option "mask"`,
		"toolgate_policy {\n query data.toolgate.request.decision\n}": "want a policy file or directory",
		"toolgate_policy p q":                                         "wrong argument count",
	} {
		var c Config
		err := c.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", input, err, want)
		}
	}
}

// Holds: in JSON, a negative timeout, an unknown evaluator and a local
// source that does not exist fail `caddy validate` with a message naming
// the stage and the problem, and the shipped policies pass.
func TestHoldsPolicyJSONRefusals(t *testing.T) {
	if err := caddyValidate(t, `{"handler": "toolgate_policy", "source": `+quoted(repoPolicies)+`}`); err != nil {
		t.Fatalf("the shipped policies: %v", err)
	}
	for handler, want := range map[string]string{
		`{"handler": "toolgate_policy", "source": ` + quoted(repoPolicies) + `, "timeout": -1}`:       "timeout must be positive",
		`{"handler": "toolgate_policy", "source": ` + quoted(repoPolicies) + `, "evaluator": "Plan"}`: `evaluator must be plan or topdown, not "Plan"`,
		`{"handler": "toolgate_policy", "source": "/nonexistent/toolgate-policies"}`:                  "/nonexistent/toolgate-policies",
		`{"handler": "toolgate_policy"}`: "a policy source",
	} {
		err := caddyValidate(t, handler)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", handler, err, want)
		}
	}
}
