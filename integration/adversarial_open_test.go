//go:build open_findings

package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Findings reproduced and not fixed yet: each test fails today. They are
// kept out of `make test` (build tag open_findings) and listed in the
// README's adversarial suite; run them with
// `go test -tags open_findings -run 'Test.*Attack' ./integration/`.
// Open now: what a stdio program writes to its log is searched for the
// credential it was started with, byte for byte (README, "Programs and
// legacy SSE servers").

const rt5ProgramEnv = "TOOLGATE_RT5_PROGRAM"

func init() {
	if os.Getenv(rt5ProgramEnv) == "server" {
		os.Exit(rt5Serve())
	}
}

// rt5Serve is an MCP server over stdio (echo) that, when it starts, writes
// the credential toolgate handed it (RT5_TOKEN) to stderr in base64 and as
// JSON text with every character escaped, and — like a program that caches
// its sign-in in its home directory — the credential the program found
// cached there from its last start (RT5_STATE), before caching its own.
func rt5Serve() int {
	tok := os.Getenv("RT5_TOKEN")
	if tok != "" {
		quoted, _ := json.Marshal(map[string]string{"authorization": "Bearer " + tok})
		var esc strings.Builder
		for _, c := range tok {
			fmt.Fprintf(&esc, `\u%04x`, c)
		}
		fmt.Fprintln(os.Stderr, "rt5 b64 "+base64.StdEncoding.EncodeToString([]byte(tok)))
		fmt.Fprintln(os.Stderr, `rt5 escaped {"token":"`+esc.String()+`"} `+string(quoted))
		// A line of stdout that is not JSON is logged the same way.
		fmt.Fprintln(os.Stdout, "rt5 stdout b64 "+base64.RawURLEncoding.EncodeToString([]byte(tok)))
	}
	if state := os.Getenv("RT5_STATE"); state != "" {
		if prev, err := os.ReadFile(state); err == nil && len(prev) > 0 && string(prev) != tok {
			fmt.Fprintln(os.Stderr, "rt5 cached sign-in "+string(prev)+" replaced")
		}
		_ = os.WriteFile(state, []byte(tok), 0o600)
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "rt5-program", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Echoes text.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			Text string `json:"text"`
		}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
		})
	_ = s.Run(context.Background(), &mcp.StdioTransport{})
	return 0
}

// rt5Program starts a gateway whose service prog runs rt5Serve per user,
// with the caller's personal token in RT5_TOKEN and the cache file state;
// its log (JSON) is at the returned path.
func rt5Program(t *testing.T, state string) (*gateway, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "gateway.log")
	if state != "" {
		state = "env RT5_STATE " + state
	}
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:9/unused", Log: "output file " + logPath + "\n\t\tformat json",
		Services: fmt.Sprintf(`service prog {
			command %s -test.run=^$
			env %s server
			%s
			per_user
			credential_env RT5_TOKEN
			auth bearer
			tools echo
			timeout 20s
			stop_timeout 2s
		}`, exe, rt5ProgramEnv, state)})
	return g, logPath
}

// rt5ProgramCall stores token as key's personal token for prog and calls
// echo through a new MCP session (which starts the user's process for that
// token), then waits for the line of the process's stderr that holds want.
func rt5ProgramCall(t *testing.T, g *gateway, logPath, key, token, want string) string {
	t.Helper()
	if r := g.api(t, http.MethodPut, "/v1/connections/prog", key, []byte(`{"token":"`+token+`"}`)); r.StatusCode/100 != 2 {
		t.Fatalf("PUT /v1/connections/prog: %d %s", r.StatusCode, r.Body)
	}
	cs := g.connect(t, key, g.createSession(t, key, "prog"), "prog", nil)
	defer cs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hi"}})
	if err != nil || res.IsError {
		t.Fatalf("premise: echo through the program failed: %v %+v", err, res)
	}
	var logged string
	waitWithin(t, 10*time.Second, "the program's stderr line "+strconv.Quote(want)+" in the log", func() bool {
		data, _ := os.ReadFile(logPath)
		logged = string(data)
		return strings.Contains(logged, want)
	})
	return logged
}

// Attack: a program's stderr goes to the log with "the credential … replaced
// by `[redacted]` wherever it begins" — as it is, byte for byte
// (stdio.redactLine: bytes.Index of each secret). A program that writes the
// credential toolgate handed it (credential_env) in another form — base64,
// as JSON text with its characters escaped (`\u0041…`), what a program
// logging its request headers or its config as JSON writes — has it kept
// in the log in the clear, to be read later by whoever reads the log. The
// relay searches every upstream message for exactly these forms ("however
// escaped, broken up by invisible characters, or in base64"); the log of
// the same program gets only the plain search. Breaks DESIGN.md:
// "Credentials … never appear in logs, errors, metrics, the catalog, or
// responses". Fix: search each logged line of a program's stderr and
// stdout for the secrets as the relay searches a message's strings (its
// escapes decoded, base64 runs decoded, invisible characters removed:
// mcpproxy's redactIn and redactBase64, moved where stdio can use them),
// or log only a digest and length of a line that holds a base64 or
// escaped run decoding to a secret.
func TestRetired5AttackProgramStderrKeepsEncodedCredential(t *testing.T) {
	g, logPath := rt5Program(t, "")
	const t1 = "rt5-personal-token-ONE-0123456789abcdef"
	logged := rt5ProgramCall(t, g, logPath, aliceKey, t1, "rt5 escaped")
	waitWithin(t, 10*time.Second, "the program's stdout line in the log", func() bool {
		data, _ := os.ReadFile(logPath)
		logged = string(data)
		return strings.Contains(logged, "rt5 stdout")
	})
	if strings.Contains(logged, t1) {
		t.Fatalf("premise: the plain credential is in the log (the plain search failed): %s", logged)
	}
	decoded := rdLogDecoded(logged)
	for _, form := range []struct{ name, text string }{
		{"base64", "rt5 b64 " + base64.StdEncoding.EncodeToString([]byte(t1))},
		{"URL-safe base64 (a line of stdout)", "rt5 stdout b64 " + base64.RawURLEncoding.EncodeToString([]byte(t1))},
		{"escaped JSON (decoded as any JSON reader of the log decodes it)", t1},
	} {
		if strings.Contains(logged, form.text) || strings.Contains(decoded, form.text) {
			where := rt5Around(logged, form.text)
			if where == "" {
				where = rt5Around(decoded, form.text)
			}
			t.Errorf("the log holds alice's personal token in %s: %s", form.name, where)
		}
	}
}

// Attack: per_user programs with credential_env get the caller's token,
// and a new process when it changes (the person stores another, an OAuth
// token is refreshed); each process's stderr is searched only for the
// credential it was started with (startProcess: s.secrets plus cred). A
// program that keeps its sign-in in its home or working directory (most
// CLI-based servers cache tokens there) and tells on stderr which cached
// sign-in it replaced writes the token the person replaced into the log
// in the clear. The relay looks for exactly those tokens in what the
// upstream says ("a token of that person's it was sent before, which
// toolgate replaced since (… a personal token the person replaced …)";
// Connection.Retired, EachCallSecret); the log of the program does not.
// Breaks DESIGN.md: "Credentials … never appear in logs". Fix: redact a
// per-user process's output with every secret of its user's connection
// (gateway.Credential.EachSecret: the token and its retired ones, and the
// connection as it stands, App.EachCallSecret), not the one token it was
// started with.
func TestRetired5AttackProgramStderrKeepsReplacedToken(t *testing.T) {
	state := filepath.Join(t.TempDir(), "cached-sign-in")
	g, logPath := rt5Program(t, state)
	const t1 = "rt5-personal-token-ONE-0123456789abcdef"
	const t2 = "rt5-personal-token-TWO-fedcba9876543210"
	rt5ProgramCall(t, g, logPath, aliceKey, t1, "rt5 b64")
	if cached, _ := os.ReadFile(state); string(cached) != t1 {
		t.Fatalf("premise: the first process did not cache its sign-in (%q)", cached)
	}
	logged := rt5ProgramCall(t, g, logPath, aliceKey, t2, "rt5 cached sign-in")
	if strings.Contains(logged, t2) {
		t.Fatalf("premise: the current token is in the log in the clear (the plain search failed)")
	}
	if strings.Contains(logged, t1) {
		t.Errorf("the log holds the personal token alice replaced, in the clear: %s", rt5Around(logged, t1))
	}
}

// rdLogDecoded is every string of every JSON line of a log, decoded, and
// every JSON text found inside them decoded once more.
func rdLogDecoded(logged string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(logged, "\n") {
		if line == "" {
			continue
		}
		d := rdDecoded([]byte(line))
		b.WriteString(d)
		for part := range strings.SplitSeq(d, "\n") {
			if i := strings.Index(part, "{"); i >= 0 {
				if j := strings.Index(part[i:], "}"); j >= 0 {
					b.WriteString(rdDecoded([]byte(part[i : i+j+1])))
				}
			}
		}
	}
	return b.String()
}

// rt5Around is text around the first occurrence of s.
func rt5Around(text, s string) string {
	i := strings.Index(text, s)
	if i < 0 {
		return ""
	}
	return "…" + strings.ReplaceAll(text[max(0, i-60):min(len(text), i+len(s)+20)], "\n", " ") + "…"
}
