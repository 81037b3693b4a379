package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	vaultapi "github.com/hashicorp/vault/api"

	"github.com/toolgate/toolgate/modules/ciphers/kms/kmstest"
	"github.com/toolgate/toolgate/modules/ciphers/local"
	"github.com/toolgate/toolgate/modules/ciphers/vaulttransit/vaulttest"
)

// Attacks on the ciphers and on credentials at rest, by someone who can
// read and write the storage (the file_system directory here) but holds
// no key: records moved between users, services and approvals, records
// replayed after a disconnect, records truncated or damaged, decisions
// forged in the clear part of an approval record; the local cipher's key
// file (its mode, two replicas creating it at once); a Vault token that
// expires. Tests whose comment starts with "Attack" describe what an
// attack would get through without the defence the test checks (each
// failed before its fix); tests named …Holds are attacks the general design
// resists.

// ---- helpers ---------------------------------------------------------------

// caPersonalServices are two bearer services beside svc, on up.
func caPersonalServices(upURL string) string {
	return `service personal {
			url ` + upURL + `
			allow_http
			tools echo
			auth bearer
		}
		service personal2 {
			url ` + upURL + `
			allow_http
			tools echo
			auth bearer
		}`
}

// caCiphers are the three ciphers, each with a fresh key; Vault and KMS
// are real servers (see vaulttest and kmstest).
func caCiphers(t *testing.T) map[string]func(t *testing.T) string {
	return map[string]func(t *testing.T) string{
		"local": func(t *testing.T) string { return "" }, // the harness's key file
		"vault_transit": func(t *testing.T) string {
			v := vaulttest.Start(t)
			return vaultCipher(v, v.NewKey(t))
		},
		"kms": func(t *testing.T) string {
			srv := kmstest.Start(t)
			return kmsCipher(srv, "awskms:///"+srv.NewKey(t), "")
		},
	}
}

// caRecordPath is where user's record for service lies in g's storage.
func caRecordPath(g *gateway, service, user string) string {
	return filepath.Join(g.DataDir, "toolgate", "connections", service, sha256Hex(user))
}

// caPutToken stores key's personal token for service.
func caPutToken(t *testing.T, g *gateway, key, service, token string) {
	t.Helper()
	if r := g.api(t, http.MethodPut, "/v1/connections/"+service, key, []byte(`{"token":"`+token+`"}`)); r.StatusCode/100 != 2 {
		t.Fatalf("PUT %s token: %d %s", service, r.StatusCode, r.Body)
	}
}

// caAuthorizations returns the Authorization headers the upstream got.
func caAuthorizations(up *upstream) []string {
	var out []string
	for _, r := range up.requestLog() {
		out = append(out, r.Header.Get("Authorization"))
	}
	return out
}

// caWrite replaces a stored file, and waits past cache_ttl (50ms).
func caWrite(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(120 * time.Millisecond)
}

// caApprovalRecord reads and decodes an approval record of g.
func caApprovalRecord(t *testing.T, g *gateway, id string) (string, map[string]any) {
	t.Helper()
	p := filepath.Join(g.DataDir, "toolgate", "approvals", id)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	return p, rec
}

// caWithheldID is the approval id of a withheld result.
func caWithheldID(t *testing.T, answer json.RawMessage) string {
	t.Helper()
	var withheld struct {
		Result struct {
			IsError bool `json:"isError"`
			Meta    struct {
				Approval struct{ ID string } `json:"toolgate/approval"`
			} `json:"_meta"`
		}
	}
	if json.Unmarshal(answer, &withheld) != nil || !withheld.Result.IsError || withheld.Result.Meta.Approval.ID == "" {
		t.Fatalf("want a withheld result, got %s", answer)
	}
	return withheld.Result.Meta.Approval.ID
}

// ---- attacks defended -------------------------------------------------------

// Attack: an approval's decision (state, decider, scope) was stored in the
// clear and bound to nothing: only its arguments and result were sealed. Someone
// who can write the storage turns a pending four-eyes approval (admins
// decide, not the requester) into one approved by an admin, and the call
// runs without anyone having decided it.
func TestCipherAttackForgedApprovalDecisionRuns(t *testing.T) {
	up, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	args := `{"text":"four-eyes wire 1,000,000 to mallory"}`
	pending := mustPend(t, m.call(1, "gated_tool", args))
	if r := g.decide(t, aliceKey, pending.ApprovalID, true, "", ""); r.StatusCode != http.StatusForbidden {
		t.Fatalf("alice approving her own four-eyes call: %d %s, want 403", r.StatusCode, r.Body)
	}

	// The storage writer forges carol's (an admin's) approval.
	path, rec := caApprovalRecord(t, g, pending.ApprovalID)
	rec["state"], rec["scope"] = "approved", "once"
	rec["decided_by"], rec["decided_groups"] = carol, []string{"admins"}
	rec["decided_at"] = time.Now().UTC().Format(time.RFC3339Nano)
	b, _ := json.Marshal(rec)
	caWrite(t, path, b)

	answer := m.call(2, "gated_tool", args)
	if n := up.upstreamCalls("gated_tool"); n != 0 {
		t.Errorf("a four-eyes call nobody decided ran upstream (%d calls) after its approval record was edited in storage: %s", n, answer)
	}
}

// Attack: the sealed part of an approval is bound to the approval's id only, not
// to the call it may be released to (requester, session, call key), which
// sit in the clear beside it. Someone who can write the storage re-labels
// bob's withheld result as alice's and approves it: alice's retry gets
// bob's result, decrypted by toolgate, though nobody holding a key helped.
func TestCipherAttackWithheldResultMovedToAnotherUser(t *testing.T) {
	_, g := approvalsGateway(t, "")
	am := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	am.initialize()
	bm := g.raw(t, bobKey, g.createSession(t, bobKey, "svc"), "svc")
	bm.initialize()

	aliceArgs := `{"text":"review-me alice"}`
	aliceID := caWithheldID(t, am.call(1, "echo", aliceArgs))
	bobID := caWithheldID(t, bm.call(1, "echo", `{"text":"review-me bob's payroll ledger"}`))

	// Re-label bob's record as alice's call, approved by alice.
	_, aliceRec := caApprovalRecord(t, g, aliceID)
	bobPath, bobRec := caApprovalRecord(t, g, bobID)
	for _, k := range []string{"requester", "session", "service", "method", "tool", "arguments_sha256", "call_key", "tool_key", "revision"} {
		bobRec[k] = aliceRec[k]
	}
	bobRec["state"], bobRec["scope"] = "approved", "once"
	bobRec["decided_by"], bobRec["decided_at"] = alice, time.Now().UTC().Format(time.RFC3339Nano)
	b, _ := json.Marshal(bobRec)
	caWrite(t, bobPath, b)
	expires, _ := bobRec["expires_at"].(string)
	caWrite(t, filepath.Join(g.DataDir, "toolgate", "approvals-by-call", aliceRec["call_key"].(string), bobID), []byte(expires))

	answer := string(am.call(2, "echo", aliceArgs))
	if strings.Contains(answer, "payroll ledger") {
		t.Errorf("alice's retry was given bob's withheld result, after the storage writer re-labelled bob's approval record: %s", answer)
	}
}

// Attack: the local cipher created its key file with O_EXCL and only then wrote
// the key: a second replica starting at the same moment (same key file on
// a shared volume) finds the file existing but still empty, and fails to
// start ("must hold 32 bytes"). A crash between the two steps leaves an
// empty key file that fails every later start.
func TestCipherAttackLocalKeyFileCreationRace(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	root := t.TempDir()
	failures, attempts := 0, 200
	var firstErr error
	for i := range attempts {
		keyFile := filepath.Join(root, aaItoa(i), "local-cipher.key")
		ciphers := []*local.Cipher{{KeyFile: keyFile}, {KeyFile: keyFile}, {KeyFile: keyFile}}
		for _, c := range ciphers {
			if err := c.Provision(ctx); err != nil {
				t.Fatal(err)
			}
		}
		errs := make([]error, len(ciphers))
		var wg sync.WaitGroup
		for j, c := range ciphers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[j] = c.Start(context.Background())
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				failures++
				if firstErr == nil {
					firstErr = err
				}
			}
		}
		if failures > 0 {
			break // one is enough to show it
		}
		// Whoever started, all open each other's records.
		sealed, err := ciphers[0].Encrypt(context.Background(), []byte("x"), []byte("ctx"))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range ciphers[1:] {
			if _, err := c.Decrypt(context.Background(), sealed, []byte("ctx")); err != nil {
				t.Fatalf("replicas started together hold different keys: %v", err)
			}
		}
	}
	if failures > 0 {
		t.Errorf("a replica starting while another created the shared key file failed to start: %v", firstErr)
	}
}

// Attack: an existing key file readable by every local user (mode 0644, say after
// a careless copy to another replica) was used without a word: anyone on
// the host who reads it decrypts every stored credential. It is refused.
func TestCipherAttackLocalKeyFileWorldReadable(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	keyFile := filepath.Join(t.TempDir(), "local-cipher.key")
	key := base64.StdEncoding.EncodeToString(make([]byte, 32))
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(keyFile, 0o644); err != nil {
		t.Fatal(err)
	}
	c := &local.Cipher{KeyFile: keyFile}
	err := c.Provision(ctx)
	if err == nil {
		err = c.Start(context.Background())
	}
	if err == nil {
		t.Errorf("a key file of mode 0644 (readable by every user of the host) was accepted; want a refusal naming the mode")
	}
}

// Attack: a static Vault token was never renewed: a renewable token with a TTL (what
// `vault token create` gives by default) stops working when the TTL runs
// out, though Vault would have renewed it, and every credential call fails
// from then on until an administrator replaces it.
func TestCipherAttackVaultStaticTokenIsNotRenewed(t *testing.T) {
	v := vaulttest.Start(t)
	key := v.NewKey(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	renewable := true
	tok, err := v.Client().Auth().Token().CreateWithContext(ctx, &vaultapi.TokenCreateRequest{TTL: "3s", ExplicitMaxTTL: "1h", Renewable: &renewable})
	if err != nil || tok.Auth == nil || !tok.Auth.Renewable {
		t.Fatalf("creating a renewable token: %v %+v", err, tok)
	}
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Services: caPersonalServices(up.URL), Extra: "cache_ttl 50ms",
		Cipher: `vault_transit {
			address ` + v.Addr + `
			token ` + tok.Auth.ClientToken + `
			key ` + key + `
		}`})
	caPutToken(t, g, aliceKey, "personal", "alice-token")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "personal"), "personal")
	m.initialize()
	// Calls every half second for 5 s: the token's 3 s TTL is renewed if
	// toolgate renews it.
	var last rpcAnswer
	for range 10 {
		time.Sleep(500 * time.Millisecond)
		last, err = m.callEcho("tick")
		if err != nil {
			t.Fatal(err)
		}
		if last.Error != nil {
			break
		}
	}
	if last.Error != nil {
		t.Errorf("a renewable static Vault token expired unrenewed while the gateway used it: the call answers %d %q (retryable %v)",
			last.Error.Code, last.Error.Message, last.Error.Data.Retryable)
	}
}

// ---- holds -----------------------------------------------------------------

// A record copied into another user's slot, or another service's, does not
// decrypt with any cipher: the call fails (no needs_sign_in, nothing sent
// upstream with the copied token), and the owner's own record still works.
func TestCipherAttackMovedRecordsHolds(t *testing.T) {
	for name, cipher := range caCiphers(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			g := startGateway(t, gatewayConfig{Upstream: up.URL, Services: caPersonalServices(up.URL), Extra: "cache_ttl 50ms", Cipher: cipher(t)})
			caPutToken(t, g, aliceKey, "personal", "alice-token")
			caPutToken(t, g, bobKey, "personal", "bob-token")
			caPutToken(t, g, aliceKey, "personal2", "alice-token-2")
			aliceRec, err := os.ReadFile(caRecordPath(g, "personal", alice))
			if err != nil {
				t.Fatal(err)
			}
			bobOwn, _ := os.ReadFile(caRecordPath(g, "personal", bob))
			alice2Own, _ := os.ReadFile(caRecordPath(g, "personal2", alice))

			for _, c := range []struct {
				what, key, user, service string
				own                      []byte
			}{
				{"alice's record in bob's slot", bobKey, bob, "personal", bobOwn},
				{"alice's record in her slot of another service", aliceKey, alice, "personal2", alice2Own},
			} {
				m := g.raw(t, c.key, g.createSession(t, c.key, c.service), c.service)
				m.initialize()
				caWrite(t, caRecordPath(g, c.service, c.user), aliceRec)
				before := len(up.requestLog())
				a, err := m.callEcho("moved")
				if err != nil {
					t.Fatal(err)
				}
				if a.Error == nil || a.Error.Data.NeedsSignIn {
					t.Errorf("%s: %s %+v; want an error that is not needs_sign_in", c.what, a.Result, a.Error)
				}
				for _, h := range caAuthorizations(up)[before:] {
					if strings.Contains(h, "alice-token") {
						t.Errorf("%s: the upstream got alice's token %q", c.what, h)
					}
				}
				if got, _ := os.ReadFile(caRecordPath(g, c.service, c.user)); string(got) != string(aliceRec) {
					t.Errorf("%s: the record was changed or deleted by the failed call", c.what)
				}
				caWrite(t, caRecordPath(g, c.service, c.user), c.own)
				m.mustEcho(t, "own record back")
			}
		})
	}
}

// Truncated, damaged, empty or foreign records fail closed with every
// cipher: the call gets an error that is not needs_sign_in and holds no
// token, nothing goes upstream, the record is left as it is (not deleted as
// "not connected"), and the gateway serves on; the intact record works
// again at once.
func TestCipherAttackDamagedRecordsHolds(t *testing.T) {
	for name, cipher := range caCiphers(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			g := startGateway(t, gatewayConfig{Upstream: up.URL, Services: caPersonalServices(up.URL), Extra: "cache_ttl 50ms", Cipher: cipher(t)})
			caPutToken(t, g, aliceKey, "personal", "alice-secret-token")
			path := caRecordPath(g, "personal", alice)
			good, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "personal"), "personal")
			m.initialize()
			m.mustEcho(t, "intact")
			s := string(good)
			flip := []byte(s)
			flip[len(flip)-5] ^= 1
			damaged := map[string]string{
				"empty":           "",
				"truncated":       s[:len(s)/2],
				"one byte off":    s[:len(s)-1],
				"bit flipped":     string(flip),
				"trailing data":   s + "AAAA",
				"other prefix":    "vault:v1:" + base64.StdEncoding.EncodeToString([]byte("x")),
				"local prefix":    "local:v1:" + strings.Repeat("A", 64),
				"kms junk":        "kms:v1:" + strings.Repeat(".", 5),
				"kms empty parts": "kms:v1:..",
				"kms huge key id": "kms:v1:" + strings.Repeat("A", 40000) + ".AAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
				"kms foreign arn": "kms:v1:" + base64.RawURLEncoding.EncodeToString([]byte("arn:aws:kms:eu-west-1:999999999999:key/00000000-0000-0000-0000-000000000000")) +
					".AAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
				"json": `{"kind":"bearer","access_token":"forged"}`,
				"nul":  "\x00\x00\x00",
			}
			for what, rec := range damaged {
				caWrite(t, path, []byte(rec))
				before := len(up.requestLog())
				a, err := m.callEcho("damaged")
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if a.Error == nil || a.Error.Data.NeedsSignIn || strings.Contains(a.Error.Message, "alice-secret-token") {
					t.Errorf("%s: %s %+v; want an error, not needs_sign_in, without the token", what, a.Result, a.Error)
				}
				if n := len(up.requestLog()) - before; n != 0 {
					t.Errorf("%s: %d requests went upstream (%v)", what, n, caAuthorizations(up)[before:])
				}
				if got, err := os.ReadFile(path); err != nil || string(got) != rec {
					t.Errorf("%s: the damaged record was changed or deleted (%v)", what, err)
				}
				if s := g.catalogService(t, aliceKey, "personal"); s.Status == "needs_sign_in" {
					t.Errorf("%s: the catalog says needs_sign_in for a record that exists", what)
				}
			}
			caWrite(t, path, good)
			m.mustEcho(t, "repaired")
		})
	}
}

// Swapping the sealed contents of two approvals (alice's arguments into
// bob's record, a result into another approval) does not open: the seal
// is bound to the approval's id, and the approval page shows nothing of
// the other's.
func TestCipherAttackSwappedApprovalSealsHolds(t *testing.T) {
	_, g := approvalsGateway(t, "")
	am := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	am.initialize()
	bm := g.raw(t, bobKey, g.createSession(t, bobKey, "svc"), "svc")
	bm.initialize()
	aliceID := caWithheldID(t, am.call(1, "echo", `{"text":"review-me alice's diary"}`))
	bobID := caWithheldID(t, bm.call(1, "echo", `{"text":"review-me bob"}`))
	_, aliceRec := caApprovalRecord(t, g, aliceID)
	bobPath, bobRec := caApprovalRecord(t, g, bobID)
	bobRec["sealed"] = aliceRec["sealed"]
	b, _ := json.Marshal(bobRec)
	caWrite(t, bobPath, b)
	r := g.api(t, http.MethodGet, "/v1/approvals/"+bobID, bobKey, nil)
	if strings.Contains(string(r.Body), "diary") {
		t.Errorf("bob's approval shows alice's sealed arguments after a swap: %s", r.Body)
	}
	if r := g.decide(t, bobKey, bobID, true, "", ""); r.StatusCode == http.StatusOK {
		answer := string(bm.call(2, "echo", `{"text":"review-me bob"}`))
		if strings.Contains(answer, "diary") {
			t.Errorf("bob's release carried alice's withheld result after a swap: %s", answer)
		}
	}
}

// Rotation of each cipher's key: a record written before still opens, one
// written after uses the new key, and (local) a replaced key file makes
// old records fail closed, not vanish.
func TestCipherAttackLocalKeyReplacedHolds(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Services: caPersonalServices(up.URL), Extra: "cache_ttl 50ms"})
	caPutToken(t, g, aliceKey, "personal", "alice-token")
	rec, _ := os.ReadFile(caRecordPath(g, "personal", alice))
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "personal"), "personal")
	m.initialize()
	m.mustEcho(t, "old key")
	// A new key file, and the gateway restarted on the same storage, once
	// the operator reset the cipher's canary to go on with the new key
	// (without that, it refuses to start: reload_checks_test.go).
	keyFile := filepath.Join(g.DataDir, "cipher.key")
	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(g.DataDir, "toolgate", "cipher-canary"), []byte("reset\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g2 := startGateway(t, gatewayConfig{Upstream: up.URL, Services: caPersonalServices(up.URL), Extra: "cache_ttl 50ms", DataDir: g.DataDir})
	m2 := g2.raw(t, aliceKey, g2.createSession(t, aliceKey, "personal"), "personal")
	_, _, msgs := m2.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	// The canary sealed with the new key vouches for it: the record never
	// opens again, and its person is asked to connect again (not told to
	// retry forever). Without a canary vouching for the key, the error
	// stays the cipher's (modules/gateway
	// TestConnectionOfAnotherKeyNeedsSignInOnlyOnceTheCanaryVouched).
	var a rpcAnswer
	if len(msgs) != 1 || json.Unmarshal(msgs[0], &a) != nil || a.Error == nil || !a.Error.Data.NeedsSignIn ||
		!strings.Contains(a.Error.Message, "a key toolgate no longer uses") {
		t.Errorf("a record of a key replaced after a reset: %s; want needs_sign_in saying why", msgs)
	}
	if r := g2.api(t, http.MethodGet, "/v1/catalog", aliceKey, nil); !strings.Contains(string(r.Body), `"status":"needs_sign_in"`) {
		t.Errorf("the catalog of a record of a key replaced after a reset: %s; want needs_sign_in", r.Body)
	}
	if got, _ := os.ReadFile(caRecordPath(g2, "personal", alice)); string(got) != string(rec) {
		t.Error("the record of the removed key was changed or deleted before its person connected again")
	}
	caPutToken(t, g2, aliceKey, "personal", "alice-token-new")
	m2.initialize()
	m2.mustEcho(t, "new key")
}
