package policy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
)

func TestPolicyEvalCommand(t *testing.T) {
	if _, ok := caddycmd.Commands()["policy"]; !ok {
		t.Fatal("toolgate policy is not registered")
	}
	policies, err := filepath.Abs(filepath.Join("..", "..", "policies"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, text string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	caddyfile := write("Caddyfile", `{
	admin off
}
:8080 {
	route /v1/mcp/* {
		toolgate_policy {
			source `+policies+`
		}
		toolgate_result_policy {
			source `+policies+`
		}
	}
}
`)
	const call = `"caller": {"user": "alice@example.com", "groups": ["eng"], "claims": {}}, "session": {"id": "s", "services": ["tracker"]},
		"service": {"id": "tracker", "auth": "oauth", "tools": ["read_ticket"]}, "method": "tools/call", "arguments": {"ticket_id": "T-1"},
		"listing": false, "request": {"remote_ip": "127.0.0.1", "protocol_version": "2025-11-25"}, "time": "2026-11-30T10:00:00Z"`
	readOnly := write("read.json", `{`+call+`, "tool": {"name": "read_ticket", "annotations_source": "upstream",
		"annotations": {"readOnlyHint": true, "destructiveHint": false, "idempotentHint": false, "openWorldHint": true}}}`)
	unmarked := write("unmarked.json", `{`+call+`, "tool": {"name": "read_ticket", "annotations_source": "default",
		"annotations": {"readOnlyHint": false, "destructiveHint": true, "idempotentHint": false, "openWorldHint": true}}}`)
	leak := write("leak.json", `{`+call+`, "tool": {"name": "read_ticket"}, "result": {"content": [{"type": "text", "text": "key AKIAIOSFODNN7EXAMPLE"}]}}`)

	conflicting := filepath.Join(dir, "conflicting")
	if err := os.Mkdir(conflicting, 0o755); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join("conflicting", "request.rego"), `package toolgate.request

decision := {"action": "allow"} if input.method == "tools/call"

decision := {"action": "deny", "reason": "no"} if input.method == "tools/call"
`)

	for _, tc := range []struct {
		name, input, config, source, stage string
		want                               []string // in the output
		err                                string
	}{
		{"request allowed", readOnly, caddyfile, "", "", []string{`"stage":"request"`, `"action":"allow"`, `marked read-only`}, ""},
		{"request denied", unmarked, caddyfile, "", "", []string{`"action":"deny"`, `by MCP's default`}, ""},
		{"result redacted", leak, caddyfile, "", "", []string{`"stage":"result"`, `"action":"allow"`, `[REDACTED:aws_access_key_id]`}, ""},
		{"a policy named directly", readOnly, "", policies, "request", []string{`"action":"allow"`}, ""},
		{"an evaluation error, said", readOnly, "", conflicting, "request", []string{`"action":"deny"`, `"failure":"error"`, `request.rego:5`}, ""},
		{"the result stage on a request input", readOnly, caddyfile, "", "result", []string{`"action":"deny"`, `no content array`}, ""},
		{"no input", "", caddyfile, "", "", nil, "--input is required"},
		{"no policy", readOnly, "", "", "", nil, "name the policy"},
		{"input not JSON", caddyfile, caddyfile, "", "", nil, "the input is not JSON"},
		{"bad stage", readOnly, caddyfile, "", "listing", nil, `--stage "listing"`},
		{"two policies", readOnly, write("Two", ":8080 {\n\troute {\n\t\ttoolgate_policy {\n\t\t\tsource "+policies+"\n\t\t}\n\t}\n}\n:8081 {\n\troute {\n\t\ttoolgate_policy {\n\t\t\tsource /elsewhere\n\t\t}\n\t}\n}\n"), "", "", nil, "different policies"},
		{"no policy directive", readOnly, write("None", ":8080 {\n\trespond ok\n}\n"), "", "", nil, "has no toolgate_policy directive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := policyEval(tc.input, tc.config, "caddyfile", Config{Source: tc.source}, tc.stage, nil)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			text := evalJSON(t, out)
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("output %s lacks %s", text, w)
				}
			}
		})
	}
}

func evalJSON(t *testing.T, out *evalOutput) string {
	t.Helper()
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
