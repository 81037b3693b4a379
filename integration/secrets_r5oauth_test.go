package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolgate/toolgate/modules/ciphers/vaulttransit/vaulttest"
)

// r5HeldCalls makes up's tools/call requests wait until release is
// called (or 20 s pass); called receives one value as each arrives.
func r5HeldCalls(t *testing.T, up *upstream) (called <-chan struct{}, release func()) {
	t.Helper()
	arrived, released := make(chan struct{}, 16), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(released) }) }
	t.Cleanup(release)
	up.setIntercept(func(_ http.ResponseWriter, r *http.Request, body []byte) bool {
		if r.Method == http.MethodPost && strings.Contains(string(body), `"tools/call"`) {
			arrived <- struct{}{}
			select {
			case <-released:
			case <-time.After(20 * time.Second):
			}
		}
		return false
	})
	return arrived, release
}

// Attack (the storage's own words to runners): when the answer of a call
// arrives, toolgate searches it for the caller's credentials, reading the
// stored connection again once the replica's copy is older than
// cache_ttl. If that read fails, the runner's JSON-RPC error quotes the
// failure whole: "toolgate could not read the caller's credential …:
// reading storage: read /var/lib/…/toolgate/connections/svc/<sha256 of
// the user>: …" — the storage's path and key layout (with Vault, its
// address, mount and key name; with PostgreSQL, its host). The federated
// endpoint was fixed for exactly this ("toolgate's own words now, the
// storage's logged"); the single-service relay of an upstream answer was
// not. The connection test (POST /v1/connections/{service}/test and the
// console's Test button) shows Probe's errors the same way.
//
// What should happen: the runner is told in toolgate's own words that the
// answer cannot be relayed right now (retryable), and the storage's or
// cipher's message goes to the log only.
func TestR5OAuthSecretSearchFailureQuotesStorageToRunner(t *testing.T) {
	up := startUpstream(t)
	called, release := r5HeldCalls(t, up)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Auth: "bearer", Tools: "echo", Extra: "cache_ttl 1s"})
	if resp := g.api(t, http.MethodPut, "/v1/connections/svc", aliceKey, []byte(`{"token":"r5-personal-token-0123456789"}`)); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("control: storing alice's token: %d %s", resp.StatusCode, resp.Body)
	}
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	if status, _, msgs := m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); status != http.StatusOK || len(msgs) != 1 || !strings.Contains(string(msgs[0]), `"echo"`) {
		t.Fatalf("control: tools/list: %d %s", status, msgs)
	}

	type answer struct {
		status int
		msgs   []json.RawMessage
	}
	done := make(chan answer, 1)
	go func() {
		status, _, msgs := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"held"}}}`)
		done <- answer{status, msgs}
	}()
	select {
	case <-called:
	case <-time.After(15 * time.Second):
		t.Fatal("control: the call never reached the upstream")
	}
	// The stored connection becomes unreadable while the call runs (a
	// failing disk, a storage outage), and the replica's copy ages past
	// cache_ttl.
	sum := sha256.Sum256([]byte(alice))
	record := filepath.Join(g.DataDir, "toolgate", "connections", "svc", hex.EncodeToString(sum[:]))
	if err := os.Remove(record); err != nil {
		t.Fatalf("control: the stored connection %s: %v", record, err)
	}
	if err := os.Mkdir(record, 0o700); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // past cache_ttl (1s): not an assertion, the copy must age
	release()
	var a answer
	select {
	case a = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the call never answered")
	}
	text := ""
	for _, m := range a.msgs {
		text += string(m)
	}
	t.Logf("the runner got %d %s", a.status, text)
	for _, leak := range []string{g.DataDir, hex.EncodeToString(sum[:]), "is a directory", "toolgate/connections"} {
		if strings.Contains(text, leak) {
			t.Errorf("the runner's error quotes the storage's own words (%q): %s", leak, text)
		}
	}
}

// Attack (the storage's own words to runners, the stateless revision):
// the implied MCP session of a 2026-07-28 runner is counted and recorded
// in the storage; when that fails, toolgate_registry answers the runner
// with the failure's own text (modules/registry/stateless.go:
// call.Unavailable(w, err.Error())) — the storage's path, key layout and
// the caller's hashed name (with PostgreSQL, its host and database). The
// federated endpoint answers the same failure in toolgate's own words
// (gateway.RunnerText); this path does not.
//
// What should happen: "storage unavailable, retry" in toolgate's words to
// the runner, the details in the log.
func TestR5OAuthStatelessSessionFailureQuotesStorageToRunner(t *testing.T) {
	up := startStatelessUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo"})
	session := g.createSession(t, aliceKey, "svc")
	// The part of the storage MCP sessions are counted in fails (a full
	// or broken disk): here, a file stands where its directory would be.
	dir := filepath.Join(g.DataDir, "toolgate", "mcp")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	status, answer := statelessPost(t, g, aliceKey, session,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{},`+statelessMeta+`}}`, nil)
	raw, _ := json.Marshal(answer)
	t.Logf("the runner got %d %s", status, raw)
	if errorCode(answer) == 0 {
		t.Fatalf("control: the call did not fail (%d %s); the storage failure was not reached", status, raw)
	}
	for _, leak := range []string{g.DataDir, "not a directory", "toolgate/mcp"} {
		if strings.Contains(string(raw), leak) {
			t.Errorf("the stateless runner's error quotes the storage's own words (%q): %s", leak, raw)
		}
	}
}

// Attack (a credential no one can make toolgate forget): an administrator
// takes alice off a service (allowed_users) and reloads. Her stored
// credential for it — a personal token, or an OAuth grant with its
// refresh token — stays in storage, and every route that would forget it
// (DELETE /v1/connections/{service}, the console's Disconnect) answers
// 404 "unknown service" to her: she can neither forget it nor have
// toolgate revoke it at the provider. If she is put back later, the old
// credential works again without her connecting. README: DELETE "forgets
// the caller's credential for the service".
//
// What should happen: a person may always forget (and revoke) their own
// stored credential, whether or not they may still use the service — or
// a reload that takes them off a service forgets it.
func TestR5OAuthRemovedUserCannotForgetTheirCredential(t *testing.T) {
	port := freePort(t)
	cfg := gatewayConfig{Upstream: "http://127.0.0.1:1/mcp", Auth: "bearer", ServiceExtra: "allowed_users " + alice}
	g := startGatewayOnPort(t, port, cfg)
	if resp := g.api(t, http.MethodPut, "/v1/connections/svc", aliceKey, []byte(`{"token":"r5-alice-token-0123456789"}`)); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("control: storing alice's token: %d %s", resp.StatusCode, resp.Body)
	}
	sum := sha256.Sum256([]byte(alice))
	record := filepath.Join(g.DataDir, "toolgate", "connections", "svc", hex.EncodeToString(sum[:]))
	if _, err := os.Stat(record); err != nil {
		t.Fatalf("control: alice's stored credential: %v", err)
	}

	cfg.DataDir, cfg.ServiceExtra = g.DataDir, "allowed_users "+bob
	g2 := startGatewayOnPort(t, port, cfg)
	resp := g2.api(t, http.MethodDelete, "/v1/connections/svc", aliceKey, nil)
	console := g2.signedIn(t, aliceKey)
	_, services := console.get(g2.URL + "/console/services")
	cstatus, _ := console.post(g2.URL+"/console/services/svc/disconnect", url.Values{"csrf": {console.csrf(services)}})
	if _, err := os.Stat(record); err == nil {
		t.Errorf("alice, taken off svc, cannot make toolgate forget her stored credential: DELETE /v1/connections/svc answered %d %s, "+
			"the console's Disconnect %d, and her record is still in storage", resp.StatusCode, resp.Body, cstatus)
	}
}

// The same as TestR5OAuthSecretSearchFailureQuotesStorageToRunner with a
// Vault Transit cipher sealed during the call: the runner is told Vault's
// address and what Vault said.
func TestR5OAuthSecretSearchFailureQuotesVaultToRunner(t *testing.T) {
	v := vaulttest.Start(t)
	key := v.NewKey(t)
	up := startUpstream(t)
	called, release := r5HeldCalls(t, up)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Auth: "bearer", Tools: "echo", Extra: "cache_ttl 1s",
		Cipher: vaultCipher(v, key)})
	if resp := g.api(t, http.MethodPut, "/v1/connections/svc", aliceKey, []byte(`{"token":"r5-personal-token-0123456789"}`)); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("control: storing alice's token: %d %s", resp.StatusCode, resp.Body)
	}
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	if status, _, msgs := m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); status != http.StatusOK || len(msgs) != 1 {
		t.Fatalf("control: tools/list: %d %s", status, msgs)
	}
	done := make(chan []json.RawMessage, 1)
	go func() {
		_, _, msgs := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"held"}}}`)
		done <- msgs
	}()
	select {
	case <-called:
	case <-time.After(15 * time.Second):
		t.Fatal("control: the call never reached the upstream")
	}
	v.Seal(t)
	time.Sleep(1500 * time.Millisecond) // past cache_ttl (1s)
	release()
	var msgs []json.RawMessage
	select {
	case msgs = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the call never answered")
	}
	text := ""
	for _, m := range msgs {
		text += string(m)
	}
	t.Logf("the runner got %s", text)
	addr := strings.TrimPrefix(strings.TrimPrefix(v.Addr, "http://"), "https://")
	for _, leak := range []string{addr, key, "vault"} {
		if strings.Contains(strings.ToLower(text), strings.ToLower(leak)) {
			t.Errorf("the runner's error quotes the cipher's own words (%q): %s", leak, text)
		}
	}
}
