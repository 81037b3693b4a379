package integration

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

// reviewProgramEnv puts this test binary in the mode of a hostile program
// of this file's; it takes over in init, before TestMain.
const reviewProgramEnv = "TOOLGATE_REVIEW_PROGRAM"

func init() {
	switch os.Getenv(reviewProgramEnv) {
	case "":
		return
	case "refuse-init":
		// Refuses toolgate's initialize naming the keys it holds, as a
		// server that reports which key was wrong does.
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			var m struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			if json.Unmarshal(in.Bytes(), &m) == nil && m.Method == "initialize" {
				fmt.Printf(`{"jsonrpc":"2.0","id":%s,"error":{"code":-32000,"message":"invalid API key: %s token: %s"}}`+"\n",
					m.ID, os.Getenv("API_KEY"), os.Getenv("TOKEN"))
			}
		}
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	case "token-gate":
		// Checks its token when it starts, as github-mcp-server does: a
		// bad one ends it at once.
		if strings.HasPrefix(os.Getenv("TOKEN"), "bad") {
			fmt.Fprintln(os.Stderr, "401 Bad credentials")
			os.Exit(1)
		}
		os.Exit(advServe())
	default:
		os.Exit(2)
	}
}

// Attack (fixed): a program refuses toolgate's initialize with an error that
// quotes the secrets it was given — the service's env API_KEY (shared
// service) and the user's personal token in credential_env (per_user
// service) — as a server reporting "invalid API key: …" does. Expected:
// neither secret reaches a runner's answer or the gateway log (README:
// stderr is logged with "the credential and every env value … replaced by
// [redacted]"; DESIGN: credentials never in logs/errors/responses).
// Happens: internal/mcpbridge/link.go:226 copies the program's message
// into the init error; modules/upstreams/stdio/supervisor.go:478 makes it
// the process's "why", which process.go:430 and supervisor.go:522 log
// verbatim and supervisor.go:396 (downLocked) returns to every runner of
// the service as the retryable "the program of service … did not
// initialize (…): toolgate restarts it in …" error; toolgate_proxy redacts
// at most the caller's own credential, never env values.
// Fixed: a server's refusal of initialize is named by its JSON-RPC code
// only (mcpbridge.Link.Initialize).
func TestReviewStdioInitRefusalLeaksSecrets(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "gateway.log")
	const apiKey = "sk-live-shared-service-key-0451"
	const token = "alice-personal-token-0452"
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	svc := func(id, extra string) string {
		return fmt.Sprintf(`service %s {
			command %s -test.run=^$
			env %s refuse-init
			env API_KEY %s
			tools echo
			timeout 5s
			%s
		}`, id, exe, reviewProgramEnv, apiKey, extra)
	}
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:9/unused", Log: "output file " + logPath + "\n\t\tformat json",
		Services: svc("refusing", "") + "\n" + svc("mine", "per_user\n\t\t\tcredential_env TOKEN\n\t\t\tauth bearer")})
	body, _ := json.Marshal(map[string]string{"token": token})
	if r := g.api(t, http.MethodPut, "/v1/connections/mine", aliceKey, body); r.StatusCode/100 != 2 {
		t.Fatalf("storing a token: %d %s", r.StatusCode, r.Body)
	}
	var answers []string
	for _, id := range []string{"refusing", "mine"} {
		for range 2 { // the first try waits for the start; the second lands in the restart backoff
			m := g.raw(t, aliceKey, g.createSession(t, aliceKey, id), id)
			_, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
			for _, msg := range msgs {
				answers = append(answers, id+": "+string(msg))
			}
		}
	}
	for _, a := range answers {
		if strings.Contains(a, apiKey) || strings.Contains(a, token) {
			t.Errorf("a runner's answer holds a secret of the program: %s", a)
		}
	}
	waitWithin(t, 5*time.Second, "the refusals in the log", func() bool {
		data, _ := os.ReadFile(logPath)
		return bytes.Contains(data, []byte("program ended; restarting it"))
	})
	data, _ := os.ReadFile(logPath)
	for _, line := range bytes.Split(data, []byte("\n")) {
		if bytes.Contains(line, []byte(apiKey)) || bytes.Contains(line, []byte(token)) {
			t.Errorf("the gateway log holds a secret: %s", line)
		}
	}
}

// Attack (fixed): none needed — routine use. Alice's stored token is bad (revoked),
// so her per_user program exits at start; she stores a good token through
// the API and her runner retries. Expected: a new credential gets a new
// process (README: "when the credential changes …, new requests go to a
// new process"), within the restart backoff at worst. Happens: her worker
// is in restart backoff; worker.ready
// (modules/upstreams/stdio/supervisor.go:357-360) answers every request in
// that state with the restart error without comparing credentials, and
// worker.restart (supervisor.go:540) restarts with w.cred, the replaced
// token. While she keeps retrying, the program keeps being started with
// the token she replaced and she never gets in (until her worker idles out
// — idle_timeout, 10m by default — with no request at all).
// Fixed: a worker waiting to restart starts at once with a credential other
// than the one it keeps ending with (worker.ready).
func TestReviewStdioNewTokenLockedOutByBackoff(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:9/unused", Services: fmt.Sprintf(`service gated {
			command %s -test.run=^$
			env %s token-gate
			tools echo
			timeout 5s
			stop_timeout 2s
			per_user
			credential_env TOKEN
			auth bearer
		}`, exe, reviewProgramEnv)})
	store := func(token string) {
		body, _ := json.Marshal(map[string]string{"token": token})
		if r := g.api(t, http.MethodPut, "/v1/connections/gated", aliceKey, body); r.StatusCode/100 != 2 {
			t.Fatalf("storing a token: %d %s", r.StatusCode, r.Body)
		}
	}
	initialize := func() (string, string) {
		m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "gated"), "gated")
		_, hdr, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
		var last string
		if len(msgs) > 0 {
			last = string(msgs[len(msgs)-1])
		}
		return hdr.Get("Mcp-Session-Id"), last
	}
	store("bad-revoked-token-1")
	if sid, msg := initialize(); sid != "" {
		t.Fatalf("the program initialized with a bad token: %s", msg)
	}
	store("good-token-2")
	deadline := time.Now().Add(5 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		sid, msg := initialize()
		if sid != "" {
			return
		}
		last = msg
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("5 s after storing a good token, alice still gets: %s", last)
}
