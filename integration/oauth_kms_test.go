package integration

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/toolgate/toolgate/modules/ciphers/kms/kmstest"
)

// OAuth grants encrypted by the kms cipher against a real KMS-compatible
// server (Local KMS, see kmstest): envelope ciphertext at rest, grants far
// larger than KMS's own 4 KiB limit, key rotation through an alias, a
// record moved to another user, and the server stopped mid-run.

// kmsCipher is the cipher option for keyURL on s, with more cipher options.
func kmsCipher(s *kmstest.Server, keyURL, extra string) string {
	return fmt.Sprintf(`kms {
			key_url  %s
			region   %s
			endpoint %s
			%s
		}`, keyURL, kmstest.Region, s.Endpoint, extra)
}

var kmsEnvelope = regexp.MustCompile(`^kms:v1:([A-Za-z0-9_-]+)\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$`)

// kmsRecord returns the key ARN a stored value names, failing unless the
// value is nothing but a kms:v1 envelope.
func kmsRecord(t testing.TB, b []byte) string {
	t.Helper()
	m := kmsEnvelope.FindSubmatch(b)
	if m == nil {
		t.Fatalf("the record is not only a kms envelope: %.60q…", b)
	}
	arn, err := base64.RawURLEncoding.DecodeString(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	return string(arn)
}

// onlyKMSRecord returns the key ARN and size of the one connection record.
func onlyKMSRecord(t testing.TB, g *gateway) (string, int) {
	t.Helper()
	files := g.connectionFiles(t, "svc")
	if len(files) != 1 {
		t.Fatalf("%d connection records, want 1", len(files))
	}
	for _, b := range files {
		return kmsRecord(t, b), len(b)
	}
	return "", 0
}

func TestOAuthGrantsAtRestWithKMS(t *testing.T) {
	srv := kmstest.Start(t)
	keyA, keyB := srv.NewKey(t), srv.NewKey(t)
	srv.SetAlias(t, "toolgate-grants", keyA)
	// 16 KiB tokens make a grant of more than 32 KiB; three seconds leave
	// time to check the grant before its first refresh.
	p := startOAuthProvider(t, providerConfig{AccessTTL: 3 * time.Second, TokenBytes: 16 << 10})
	up := startProtectedUpstream(t, p)
	// A short cache_ttl makes calls read (and decrypt) the stored grant.
	g := oauthGateway(t, p, up, gatewayConfig{Cipher: kmsCipher(srv, "awskms://alias/toolgate-grants", ""), Extra: "cache_ttl 50ms"})

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
	calls := p.calls()
	verifier := calls[0].Form.Get("code_verifier")
	for _, b := range pending {
		var rec struct {
			Sealed []byte `json:"sealed"`
		}
		if err := json.Unmarshal(b, &rec); err != nil || verifier == "" || bytes.Contains(b, []byte(verifier)) || kmsRecord(t, rec.Sealed) != keyA {
			t.Fatalf("the pending sign-in is not a kms envelope under key A: %.200s", b)
		}
	}
	if n := len(calls[0].IssuedAccess); n != 16<<10 {
		t.Fatalf("the provider issued a %d-byte access token, want 16 KiB", n)
	}
	arn, size := onlyKMSRecord(t, g)
	if arn != keyA || size < 32<<10 {
		t.Fatalf("the grant is a %d-byte envelope under %s; want more than 32 KiB under key A %s", size, arn, keyA)
	}
	checkNoTokensAtRest(t, g, p)

	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	m.mustEcho(t, "before rotation")

	// The alias moves to key B: the record under key A still decrypts, and
	// the next save (the refresh) uses key B.
	srv.SetAlias(t, "toolgate-grants", keyB)
	time.Sleep(60 * time.Millisecond)
	m.mustEcho(t, "after rotation")
	if n := len(p.refreshes()); n != 0 {
		t.Fatalf("a refresh happened before the token expired (%d); the test ran too slowly to tell the keys apart", n)
	}
	if arn, _ := onlyKMSRecord(t, g); arn != keyA {
		t.Fatalf("after rotation, before any save: key %s, want key A", arn)
	}
	time.Sleep(time.Until(connectedAt.Add(3*time.Second + 150*time.Millisecond)))
	m.mustEcho(t, "after refresh")
	if n := len(p.refreshes()); n != 1 {
		t.Fatalf("%d refreshes, want 1", n)
	}
	if arn, size := onlyKMSRecord(t, g); arn != keyB || size < 32<<10 {
		t.Fatalf("the refreshed grant is a %d-byte envelope under %s, want key B %s", size, arn, keyB)
	}
	time.Sleep(60 * time.Millisecond)
	m.mustEcho(t, "reading key B")
	p.checkRotation(t)
	checkNoTokensAtRest(t, g, p)
	users, refused := up.seen()
	if refused != 0 || len(users) == 0 {
		t.Fatalf("the upstream accepted %d requests and refused %d: toolgate sent a damaged or stale 16 KiB token", len(users), refused)
	}
}

func TestOAuthKMSRecordMovedToAnotherUser(t *testing.T) {
	srv := kmstest.Start(t)
	key := srv.NewKey(t)
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{Cipher: kmsCipher(srv, "awskms:///"+key, ""), Extra: "cache_ttl 50ms"})
	g.connectOAuth(t, aliceKey)
	aliceFiles := g.connectionFiles(t, "svc")
	g.connectOAuth(t, carolKey)
	var aliceRecord []byte
	carolFile := ""
	for name := range g.connectionFiles(t, "svc") {
		if a, ok := aliceFiles[name]; ok {
			aliceRecord = a
		} else {
			carolFile = name
		}
	}
	if aliceRecord == nil || carolFile == "" {
		t.Fatal("cannot tell alice's record from carol's")
	}
	carol := g.raw(t, carolKey, g.createSession(t, carolKey, "svc"), "svc")
	carol.initialize()
	carol.mustEcho(t, "carol's own grant")
	before, _ := up.seen()

	// Alice's record copied over carol's: it must not decrypt for carol.
	path := filepath.Join(g.DataDir, "toolgate", "connections", "svc", carolFile)
	if err := os.WriteFile(path, aliceRecord, 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond)
	a, err := carol.callEcho("with alice's record")
	if err != nil {
		t.Fatal(err)
	}
	if a.Error == nil || len(a.Result) != 0 {
		t.Fatalf("carol's call with alice's record answered %s, error %+v; want an error", a.Result, a.Error)
	}
	after, _ := up.seen()
	if len(after) != len(before) {
		t.Fatalf("the upstream saw %d more requests (as %v): alice's token was used for carol", len(after)-len(before), after[len(before):])
	}
	alice := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	alice.initialize()
	alice.mustEcho(t, "alice is unaffected")
}

func TestOAuthKMSStoppedIsRetryable(t *testing.T) {
	srv := kmstest.Start(t)
	key := srv.NewKey(t)
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Second})
	up := startProtectedUpstream(t, p)
	// Data keys serve reads from memory for 300ms only, so the outage shows
	// at once.
	g := oauthGateway(t, p, up, gatewayConfig{Cipher: kmsCipher(srv, "awskms:///"+key, "cache_ttl 300ms\ntimeout 2s"), Extra: "cache_ttl 50ms"})
	g.connectOAuth(t, aliceKey)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	m.mustEcho(t, "kms up")
	before := g.connectionFiles(t, "svc")

	refreshed := len(p.refreshes())
	srv.Stop()
	time.Sleep(400 * time.Millisecond)
	a, err := m.callEcho("kms down")
	if err != nil {
		t.Fatal(err)
	}
	if a.Error == nil || a.Error.Code != -32011 || !a.Error.Data.Retryable || !strings.Contains(a.Error.Message, "cipher unavailable") {
		t.Fatalf("a call while KMS is down: result %s, error %+v; want -32011 retryable", a.Result, a.Error)
	}
	// Once the token expired, the grant cannot be read to refresh it: still
	// retryable, and the provider is not asked for a token toolgate could
	// not store.
	waitExpiry(time.Second)
	a, err = m.callEcho("kms down and expired")
	if err != nil {
		t.Fatal(err)
	}
	if a.Error == nil || a.Error.Code != -32011 || !a.Error.Data.Retryable {
		t.Fatalf("an expired call while KMS is down: result %s, error %+v; want -32011 retryable", a.Result, a.Error)
	}
	if n := len(p.refreshes()); n != refreshed {
		t.Fatalf("%d refreshes while KMS was down, want none", n-refreshed)
	}
	after := g.connectionFiles(t, "svc")
	if len(after) != len(before) {
		t.Fatalf("%d records after the outage, %d before", len(after), len(before))
	}
	for k := range before {
		if !bytes.Equal(before[k], after[k]) {
			t.Fatal("the stored grant changed while KMS was down")
		}
	}
	if s := g.catalogService(t, aliceKey, "svc"); s.Status != "unavailable" {
		t.Errorf("catalog while KMS is down: %+v, want unavailable", s)
	}
	// (Alice's own sign-in record was read moments before the outage, so
	// it may still be sealed once under that data key; carol's never was.)
	if status, page := g.signedIn(t, carolKey).tryConnect("svc"); status != 503 || !strings.Contains(page, "Try again in a moment") {
		t.Errorf("starting a sign-in while KMS is down: %d %s, want 503", status, page)
	}

	// KMS is back: the grant is read, refreshed and stored again.
	srv.Restart(t)
	m.mustEcho(t, "kms back")
	if n := len(p.refreshes()); n != refreshed+1 {
		t.Fatalf("%d refreshes after KMS came back, want 1", n-refreshed)
	}
	if arn, _ := onlyKMSRecord(t, g); arn != key {
		t.Fatalf("the refreshed grant names key %s, want %s", arn, key)
	}
	p.checkRotation(t)
	checkNoTokensAtRest(t, g, p)
}

// TestKMSCipherValidatesOffline runs what `toolgate validate` runs on a
// Caddyfile with the kms cipher: good settings pass and bad ones fail with
// a message naming the option, and neither contacts the endpoint (a
// listener that counts connections).
func TestKMSCipherValidatesOffline(t *testing.T) {
	kmstest.Environ(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var dialled atomic.Int64
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			dialled.Add(1)
			conn.Close()
		}
	}()
	validate := func(cipher string) error {
		cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(`{
	admin off
	toolgate {
		cipher `+cipher+`
	}
}`), nil)
		if err != nil {
			return err
		}
		var cfg caddy.Config
		if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
			t.Fatal(err)
		}
		return caddy.Validate(&cfg)
	}
	endpoint := "http://" + l.Addr().String()
	if err := validate(`kms {
			key_url  awskms://alias/toolgate
			region   eu-west-1
			endpoint ` + endpoint + `
		}`); err != nil {
		t.Fatalf("a good kms cipher: %v", err)
	}
	for cipher, want := range map[string]string{
		"kms {\n key_url awskms://alias/toolgate\n region eu-west-1\n endpoint " + endpoint + "\n cache_sise 5\n}": `kms: unknown option "cache_sise"`,
		"kms {\n region eu-west-1\n}": "kms: key_url is required",
		"kms {\n key_url gcpkms://projects/p/locations/l/keyRings/r/cryptoKeys/k\n}":                      "gcpkms:// is not supported",
		"kms {\n key_url awskms://alias/toolgate\n}":                                                      "kms: no region",
		"kms {\n key_url awskms://alias/toolgate\n region eu-west-1\n endpoint http://kms.example.com\n}": "only on a loopback address",
	} {
		if err := validate(cipher); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validating %q: %v; want an error containing %q", cipher, err, want)
		}
	}
	if n := dialled.Load(); n != 0 {
		t.Errorf("validation contacted the KMS endpoint %d times", n)
	}
}
