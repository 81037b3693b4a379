package integration

// Adversarial tests of what a program toolgate runs over stdio puts in
// toolgate's log through the words of its messages (not its stderr, which
// is redacted): text toolgate reads from the program's messages and logs
// as it is. Tests named TestUpstreamTextAttack… whose comment starts with
// "Attack" describe what an attack would get through without the defence
// the test checks (each failed before its fix).
//
// The programs are this test binary in a mode of its own
// (upstreamTextProgramEnv): a JSON-RPC server over stdin and stdout,
// written by hand so that it can answer what the Go SDK would not send.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// upstreamTextProgramEnv puts this test binary in the mode of a hostile
// program of this file's; it takes over in init, before TestMain.
const upstreamTextProgramEnv = "TOOLGATE_UPSTREAMTEXT_PROGRAM"

func init() {
	mode := os.Getenv(upstreamTextProgramEnv)
	if mode == "" {
		return
	}
	// The secret it was given: the per_user token when it has one, else
	// the service's API key.
	secret := os.Getenv("TOKEN")
	if secret == "" {
		secret = os.Getenv("API_KEY")
	}
	out := bufio.NewWriter(os.Stdout)
	write := func(format string, args ...any) {
		fmt.Fprintf(out, format+"\n", args...)
		out.Flush()
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(in.Bytes(), &m) != nil || m.ID == nil {
			continue
		}
		switch {
		case m.Method == "initialize" && mode == "version":
			// Names the version it speaks with the secret (a server that
			// reports its configuration back, or a broken one).
			write(`{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":%q,"capabilities":{"tools":{}},"serverInfo":{"name":"r","version":"1"}}}`, m.ID, secret)
		case m.Method == "initialize":
			write(`{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"r","version":"1"}}}`, m.ID)
		case m.Method == "tools/list":
			write(`{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"echo","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}]}}`, m.ID)
		case m.Method == "tools/call" && mode == "method":
			// Asks the caller something under a method named by the
			// secret, then answers.
			write(`{"jsonrpc":"2.0","id":"ask-1","method":%q,"params":{}}`, secret)
			write(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"ok"}]}}`, m.ID)
		case m.Method == "tools/call":
			write(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"ok"}]}}`, m.ID)
		case m.Method != "":
			write(`{"jsonrpc":"2.0","id":%s,"result":{}}`, m.ID)
		}
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// upstreamTextGateway starts a gateway logging to a file, with a shared
// service "shared" whose program has apiKey in API_KEY, and a per_user
// service "mine" whose program gets alice's token in TOKEN; both run the
// program in mode.
func upstreamTextGateway(t *testing.T, mode, apiKey, token string) (*gateway, string) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "gateway.log")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	svc := func(id, extra string) string {
		return fmt.Sprintf(`service %s {
			command %s -test.run=^$
			env %s %s
			env API_KEY %s
			tools echo
			timeout 5s
			stop_timeout 2s
			%s
		}`, id, exe, upstreamTextProgramEnv, mode, apiKey, extra)
	}
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:9/unused", Log: "output file " + logPath + "\n\t\tformat json",
		Services: svc("shared", "") + "\n" + svc("mine", "per_user\n\t\t\tcredential_env TOKEN\n\t\t\tauth bearer")})
	body, _ := json.Marshal(map[string]string{"token": token})
	if r := g.api(t, http.MethodPut, "/v1/connections/mine", aliceKey, body); r.StatusCode/100 != 2 {
		t.Fatalf("storing a token: %d %s", r.StatusCode, r.Body)
	}
	return g, logPath
}

// logLinesHolding returns the lines of the log at path that hold any of
// secrets.
func logLinesHolding(path string, secrets ...string) []string {
	data, _ := os.ReadFile(path)
	var out []string
	for _, line := range bytes.Split(data, []byte("\n")) {
		for _, s := range secrets {
			if bytes.Contains(line, []byte(s)) {
				out = append(out, string(line))
				break
			}
		}
	}
	return out
}

// Attack: a program answers toolgate's initialize naming its protocol
// version with a secret it was given — the service's env API_KEY (shared
// service), the user's personal token in credential_env (per_user). The
// version is text of the program's that toolgate logs as it is: the
// supervisor's "program started" line logs it whatever its length, and
// toolgate_proxy, which refuses each runner's initialize on a version it
// does not speak, logs one of up to 32 bytes (a 32-character API key
// fits). Expected: neither secret in the gateway log (README: what a
// program writes reaches the log with every env value and the credential
// replaced by [redacted]; a refusal of initialize is logged by its code
// only — TestReviewStdioInitRefusalLeaksSecrets).
func TestUpstreamTextAttackInitializeVersionLogged(t *testing.T) {
	const apiKey = "sk-live-shared-versionkey-0461"
	const token = "alice-version-token-0462"
	g, logPath := upstreamTextGateway(t, "version", apiKey, token)
	for _, id := range []string{"shared", "mine"} {
		m := g.raw(t, aliceKey, g.createSession(t, aliceKey, id), id)
		_, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
		for _, msg := range msgs {
			if strings.Contains(string(msg), apiKey) || strings.Contains(string(msg), token) {
				t.Errorf("%s: the runner's answer holds a secret of the program: %s", id, msg)
			}
		}
	}
	waitWithin(t, 5*time.Second, "both programs started", func() bool {
		data, _ := os.ReadFile(logPath)
		return bytes.Count(data, []byte(`"program started"`)) >= 2
	})
	for _, line := range logLinesHolding(logPath, apiKey, token) {
		t.Errorf("the gateway log holds a secret of the program: %s", line)
	}
}

// Attack: a program sends a server→client request whose method is a
// secret it was given. The bridge names such a method to the log as "a
// method MCP does not define" (mcpmsg.LoggedMethod: the server has
// secrets toolgate cannot redact) and relays it; toolgate_proxy, which
// refuses it to a runner whose call takes no SSE stream, logs the method
// as it is. Expected: neither secret in the gateway log.
func TestUpstreamTextAttackServerRequestMethodLogged(t *testing.T) {
	const apiKey = "sk-live-shared-methodkey-0471"
	const token = "alice-method-token-0472"
	g, logPath := upstreamTextGateway(t, "method", apiKey, token)
	for _, id := range []string{"shared", "mine"} {
		m := g.raw(t, aliceKey, g.createSession(t, aliceKey, id), id)
		m.initialize()
		// A call whose answer is JSON: a server request cannot ride on it.
		status, _, body := m.rawRequest(http.MethodPost, map[string]string{"Accept": "application/json", "Mcp-Protocol-Version": "2025-11-25"},
			strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{}}}`))
		if status != http.StatusOK || !strings.Contains(body, `"ok"`) {
			t.Fatalf("%s: tools/call: %d %s", id, status, body)
		}
	}
	waitWithin(t, 5*time.Second, "the refusals in the log", func() bool {
		data, _ := os.ReadFile(logPath)
		return bytes.Count(data, []byte(`"refused a server request"`)) >= 2
	})
	for _, line := range logLinesHolding(logPath, apiKey, token) {
		t.Errorf("the gateway log holds a secret of the program: %s", line)
	}
}
