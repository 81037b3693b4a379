package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/modules/ciphers/vaulttransit/vaulttest"
)

// OAuth grants encrypted by a real Vault's Transit engine (a dev server,
// see vaulttest): what lands in storage, key rotation, a sealed Vault.

// vaultCipher is the cipher option for a vault_transit key of v.
func vaultCipher(v *vaulttest.Server, key string) string {
	return fmt.Sprintf(`vault_transit {
			address %s
			token %s
			key %s
		}`, v.Addr, v.RootToken, key)
}

var vaultCiphertext = regexp.MustCompile(`^vault:v(\d+):[A-Za-z0-9+/]+=*$`)

// onlyVaultCiphertext returns the key version of the one connection record,
// failing unless the record is nothing but Vault Transit ciphertext.
func onlyVaultCiphertext(t testing.TB, g *gateway) string {
	t.Helper()
	files := g.connectionFiles(t, "svc")
	if len(files) != 1 {
		t.Fatalf("%d connection records, want 1", len(files))
	}
	for _, b := range files {
		m := vaultCiphertext.FindSubmatch(b)
		if m == nil {
			t.Fatalf("the connection record is not only Vault ciphertext: %.60q…", b)
		}
		return string(m[1])
	}
	return ""
}

func TestOAuthGrantsAtRestWithVaultTransit(t *testing.T) {
	v := vaulttest.Start(t)
	key := v.NewKey(t)
	// Three seconds leave time to check the grant before its first refresh.
	p := startOAuthProvider(t, providerConfig{AccessTTL: 3 * time.Second})
	up := startProtectedUpstream(t, p)
	// A short cache_ttl makes calls read (and decrypt) the stored grant.
	g := oauthGateway(t, p, up, gatewayConfig{Cipher: vaultCipher(v, key), Extra: "cache_ttl 50ms"})

	// While the sign-in is pending, its PKCE verifier is stored sealed.
	browser := g.signedIn(t, aliceKey)
	cb := providerRedirect(t, browser.startConnect("svc"))
	pending := readFiles(t, filepath.Join(g.DataDir, "toolgate", "oauth-pending", sha256Hex(alice)))
	if len(pending) != 1 {
		t.Fatalf("%d pending sign-ins stored, want 1", len(pending))
	}
	if status, page := browser.get(cb.String()); status != 200 || !strings.Contains(page, "is connected") {
		t.Fatalf("callback: %d %s", status, page)
	}
	connectedAt := time.Now()
	verifier := p.calls()[0].Form.Get("code_verifier")
	for _, b := range pending {
		var rec struct {
			ExpiresAt time.Time `json:"expires_at"`
			Sealed    []byte    `json:"sealed"`
		}
		if err := json.Unmarshal(b, &rec); err != nil || verifier == "" || bytes.Contains(b, []byte(verifier)) ||
			!vaultCiphertext.Match(rec.Sealed) || rec.ExpiresAt.Before(time.Now().Add(9*time.Minute)) {
			t.Fatalf("the pending sign-in is not an expiry and Vault ciphertext: %s", b)
		}
	}
	if ver := onlyVaultCiphertext(t, g); ver != "1" {
		t.Fatalf("the grant is encrypted with key version %s, want 1", ver)
	}
	checkNoTokensAtRest(t, g, p)

	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	m.mustEcho(t, "before rotation")

	// Rotate the key: the v1 record still decrypts, and the next save (the
	// refresh) uses v2.
	v.RotateKey(t, key)
	time.Sleep(60 * time.Millisecond)
	m.mustEcho(t, "after rotation")
	if n := len(p.refreshes()); n != 0 {
		t.Fatalf("a refresh happened before the token expired (%d); the test ran too slowly to tell the versions apart", n)
	}
	if ver := onlyVaultCiphertext(t, g); ver != "1" {
		t.Fatalf("after rotation, before any save: key version %s, want 1", ver)
	}
	time.Sleep(time.Until(connectedAt.Add(3*time.Second + 150*time.Millisecond)))
	m.mustEcho(t, "after refresh")
	if n := len(p.refreshes()); n != 1 {
		t.Fatalf("%d refreshes, want 1", n)
	}
	if ver := onlyVaultCiphertext(t, g); ver != "2" {
		t.Fatalf("the refreshed grant is encrypted with key version %s, want 2", ver)
	}
	time.Sleep(60 * time.Millisecond)
	m.mustEcho(t, "reading v2")
	checkNoTokensAtRest(t, g, p)
}

func TestOAuthSealedVaultIsRetryable(t *testing.T) {
	v := vaulttest.Start(t)
	key := v.NewKey(t)
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Second})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{Cipher: vaultCipher(v, key), Extra: "cache_ttl 50ms"})
	g.connectOAuth(t, aliceKey)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	m.mustEcho(t, "unsealed")
	before := g.connectionFiles(t, "svc")

	refreshed := len(p.refreshes())
	v.Seal(t)
	time.Sleep(60 * time.Millisecond)
	a, err := m.callEcho("sealed")
	if err != nil {
		t.Fatal(err)
	}
	if a.Error == nil || a.Error.Code != -32011 || !a.Error.Data.Retryable || !strings.Contains(a.Error.Message, "cipher unavailable") {
		t.Fatalf("a call while Vault is sealed: result %s, error %+v; want -32011 retryable", a.Result, a.Error)
	}
	// Once the token expired, the grant cannot be read to refresh it: still
	// retryable, and the provider is not asked for a token toolgate could
	// not store.
	waitExpiry(time.Second)
	a, err = m.callEcho("sealed and expired")
	if err != nil {
		t.Fatal(err)
	}
	if a.Error == nil || a.Error.Code != -32011 || !a.Error.Data.Retryable {
		t.Fatalf("an expired call while Vault is sealed: result %s, error %+v; want -32011 retryable", a.Result, a.Error)
	}
	if n := len(p.refreshes()); n != refreshed {
		t.Fatalf("%d refreshes while Vault is sealed, want none", n-refreshed)
	}
	after := g.connectionFiles(t, "svc")
	for k := range before {
		if !bytes.Equal(before[k], after[k]) {
			t.Fatal("the stored grant changed while Vault was sealed")
		}
	}
	// The gateway is still up and says why.
	if s := g.catalogService(t, aliceKey, "svc"); s.Status != "unavailable" {
		t.Errorf("catalog while Vault is sealed: %+v, want unavailable", s)
	}
	if status, page := g.signedIn(t, aliceKey).tryConnect("svc"); status != 503 || !strings.Contains(page, "Try again in a moment") {
		t.Errorf("starting a sign-in while Vault is sealed: %d %s, want 503", status, page)
	}
}
