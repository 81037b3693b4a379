package policy

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Holds: toolgate policy eval --config never picks one key among
// directives that verify the same bundle differently (one with
// verification_key, one without: the gateway runs both, and the unsigned
// bundle passes the second) — it names them and asks for --policy; a key
// given for a local source (--policy file with --verification-key, or a
// configured local source with verification_key) is an error, as in the
// gateway.
func TestReviewHoldsPolicyEvalKeyChoice(t *testing.T) {
	private, publicFile := signingKey(t)
	const deny = "package toolgate.request\n\ndecision := {\"action\": \"deny\", \"reason\": \"signed\"}\n"
	body := signedBundle(t, deny, private, false)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(body) }))
	defer srv.Close()
	dir := t.TempDir()
	input := filepath.Join(dir, "input.json")
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("input.json", `{"method": "tools/call", "arguments": {}}`)
	url := srv.URL + "/bundle.tar.gz"
	two := write("Caddyfile.two", ":8080 {\n\troute /a {\n\t\ttoolgate_policy {\n\t\t\tsource "+url+"\n\t\t\tverification_key "+publicFile+
		"\n\t\t}\n\t}\n\troute /b {\n\t\ttoolgate_policy {\n\t\t\tsource "+url+"\n\t\t}\n\t}\n}\n")
	if out, err := policyEval(input, two, "caddyfile", Config{}, "", nil); err == nil {
		t.Errorf("two directives, one verifying the bundle and one not: evaluated %+v", out)
	} else if !strings.Contains(err.Error(), "verified with") {
		t.Errorf("the error does not tell the directives apart: %v", err)
	}
	rego := write("p.rego", deny)
	if out, err := policyEval(input, "", "", Config{Source: rego, VerificationKey: publicFile}, "", nil); err == nil {
		t.Errorf("--policy of a local file with --verification-key: evaluated %+v", out)
	}
	local := write("Caddyfile.local", ":8080 {\n\troute {\n\t\ttoolgate_policy {\n\t\t\tsource "+rego+"\n\t\t\tverification_key "+publicFile+"\n\t\t}\n\t}\n}\n")
	if out, err := policyEval(input, local, "caddyfile", Config{}, "", nil); err == nil {
		t.Errorf("a configured local source with verification_key: evaluated %+v", out)
	}
}
