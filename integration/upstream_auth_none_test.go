package integration

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// An upstream that asks for a credential (401) of a service configured
// with none: the runner is told what is wrong and that retrying will not
// mend it (no credential was sent to be refused; not retryable).
func TestUpstreamAskingForACredentialOfAServiceWithNone(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		w.Header().Set("WWW-Authenticate", `Bearer realm="upstream"`)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return true
	})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if len(msgs) != 1 {
		t.Fatalf("initialize: %s", msgs)
	}
	e := gjson.GetBytes(msgs[0], "error")
	if !strings.Contains(e.Get("message").String(), "(auth none)") || e.Get("data.retryable").Bool() {
		t.Errorf("initialize against an upstream asking for a credential, service with auth none: %s (want the missing auth named, not retryable)", msgs[0])
	}
}

// The connection test of a personal credential the upstream refuses (401)
// says to connect again, with where, as a call refused so is told
// (needs_sign_in), rather than a bare error.
func TestConnectionTestOfARefusedPersonalTokenSaysConnectAgain(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Auth: "bearer"})
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return true
	})
	if r := g.api(t, http.MethodPut, "/v1/connections/svc", aliceKey, []byte(`{"token":"alice-stale-token"}`)); r.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT the token: %d %s", r.StatusCode, r.Body)
	}
	r := g.api(t, http.MethodPost, "/v1/connections/svc/test", aliceKey, nil)
	if gjson.GetBytes(r.Body, "ok").Bool() || !gjson.GetBytes(r.Body, "needs_sign_in").Bool() || gjson.GetBytes(r.Body, "connect_url").String() == "" {
		t.Errorf("the connection test of a token the upstream refuses: %d %s, want ok false, needs_sign_in and a connect_url", r.StatusCode, r.Body)
	}
}

// An upstream that cannot be reached is logged with what failed (here a
// refused connection), for the operator: the runner is told only that it
// is unreachable, and the log never holds the service URL's query, which
// may carry a secret.
func TestUnreachableUpstreamIsLoggedWithItsCause(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "gateway.log")
	closed := fmt.Sprintf("http://127.0.0.1:%d/mcp?api_key=query-secret-4711", freePort(t))
	g := startGateway(t, gatewayConfig{Upstream: closed, Log: "output file " + logFile + "\n\t\tlevel WARN"})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if len(msgs) != 1 || !strings.Contains(string(msgs[0]), "unreachable") || strings.Contains(string(msgs[0]), "refused") {
		t.Fatalf("premise: the runner's answer: %s", msgs)
	}
	var log []byte
	for range 50 { // the entry is written as the answer goes out
		log, _ = os.ReadFile(logFile)
		if strings.Contains(string(log), "upstream unavailable") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(string(log), `"cause":"dial tcp 127.0.0.1:`) || !strings.Contains(string(log), "connection refused") {
		t.Errorf("the log does not say what failed:\n%s", log)
	}
	if strings.Contains(string(log), "query-secret-4711") {
		t.Errorf("the log holds the service URL's query:\n%s", log)
	}
}

// A service reached over plain http across the network (allow_http on a
// host that is not this machine) is warned about at start; one on a
// loopback address is not.
func TestPlainHTTPAcrossTheNetworkIsWarnedAbout(t *testing.T) {
	up := startUpstream(t)
	logFile := filepath.Join(t.TempDir(), "gateway.log")
	startGateway(t, gatewayConfig{Upstream: up.URL, Log: "output file " + logFile + "\n\t\tlevel WARN", Services: `service remote {
			url http://tracker.example.com/mcp
			allow_http
			tools anything
		}`})
	log, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	var warned []string
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "plain http across the network") {
			warned = append(warned, gjson.Get(line, "service").String())
		}
	}
	if len(warned) != 1 || warned[0] != "remote" {
		t.Errorf("services warned about plain http: %v, want [remote] (svc is on 127.0.0.1)\n%s", warned, log)
	}
}
