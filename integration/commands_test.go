package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The operators' commands of the toolgate binary, run as an operator runs
// them: toolgate hash-key and toolgate policy eval (README, "Runner
// authentication" and "Audit log and metrics").
func TestOperatorCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	dir := t.TempDir()
	run := func(stdin string, args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		cmd.Stdin = strings.NewReader(stdin)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
	}

	t.Run("hash-key", func(t *testing.T) {
		for _, in := range []string{aliceKey, aliceKey + "\n", aliceKey + "\r\n"} {
			out, errOut, code := run(in, "hash-key")
			if code != 0 || out != hashKey(aliceKey)+"\n" {
				t.Errorf("hash-key of %q: exit %d, %q (%s); want %s", in, code, out, errOut, hashKey(aliceKey))
			}
		}
		for in, want := range map[string]string{
			"":               "give the API key on standard input",
			"\n":             "empty",
			" " + aliceKey:   "white space",
			aliceKey + " \n": "white space",
		} {
			out, errOut, code := run(in, "hash-key")
			if code == 0 || out != "" || !strings.Contains(errOut, want) {
				t.Errorf("hash-key of %q: exit %d, %q, %q; want a failure saying %q", in, code, out, errOut, want)
			}
		}
	})

	t.Run("policy eval", func(t *testing.T) {
		policies, err := filepath.Abs(filepath.Join("..", "policies"))
		if err != nil {
			t.Fatal(err)
		}
		write := func(name, text string) {
			t.Helper()
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		write("Caddyfile", ":8080 {\n\troute /v1/mcp/* {\n\t\ttoolgate_policy {\n\t\t\tsource "+policies+"\n\t\t}\n\t}\n}\n")
		const call = `"caller": {"user": "alice@example.com", "groups": ["eng"], "claims": {}}, "session": {"id": "s", "services": ["tracker"]},
			"service": {"id": "tracker", "auth": "oauth", "tools": ["read_ticket"]}, "method": "tools/call", "arguments": {"ticket_id": "T-1"},
			"listing": false, "request": {"remote_ip": "127.0.0.1", "protocol_version": "2025-11-25"}, "time": "2026-11-30T10:00:00Z"`
		write("read.json", `{`+call+`, "tool": {"name": "read_ticket", "annotations_source": "upstream",
			"annotations": {"readOnlyHint": true, "destructiveHint": false, "idempotentHint": false, "openWorldHint": true}}}`)
		write("unmarked.json", `{`+call+`, "tool": {"name": "read_ticket", "annotations_source": "default",
			"annotations": {"readOnlyHint": false, "destructiveHint": true, "idempotentHint": false, "openWorldHint": true}}}`)
		write("broken.json", `{"caller": `)

		for _, tc := range []struct {
			input, stdin string
			code         int
			action       string // in the printed decision; "" when it fails
			stderr       string
		}{
			{"read.json", "", 0, "allow", ""},
			{"unmarked.json", "", 3, "deny", ""},
			{"-", `{` + call + `, "tool": {"name": "read_ticket"}}`, 3, "ask", ""},
			{"broken.json", "", 1, "", "the input is not JSON"},
			{"missing.json", "", 1, "", "reading the input"},
		} {
			out, errOut, code := run(tc.stdin, "policy", "eval", "--config", "Caddyfile", "--input", tc.input)
			if code != tc.code {
				t.Errorf("%s: exit %d, want %d\n%s%s", tc.input, code, tc.code, out, errOut)
				continue
			}
			if tc.action == "" {
				if !strings.Contains(errOut, tc.stderr) {
					t.Errorf("%s: stderr %q, want %q", tc.input, errOut, tc.stderr)
				}
				continue
			}
			var decision struct{ Stage, Source, Action, Reason string }
			if err := json.Unmarshal([]byte(out), &decision); err != nil {
				t.Fatalf("%s: the output is not the decision: %v\n%s", tc.input, err, out)
			}
			if decision.Stage != "request" || decision.Source != policies || decision.Action != tc.action || decision.Reason == "" {
				t.Errorf("%s: %+v, want the request stage's %s with a reason from %s", tc.input, decision, tc.action, policies)
			}
		}
	})
}
