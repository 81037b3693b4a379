package console

import (
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/modules/gateway"
)

// A sign-in under way when state_secret is rotated completes while the old
// secret is kept as a previous one; a cookie sealed with a secret no longer
// configured, or altered, is refused.
func TestSignInCookieOpensUnderAPreviousSecret(t *testing.T) {
	oldSecret := strings.Repeat("o", 32)
	newSecret := strings.Repeat("n", 32)
	st := signInState{Issuer: "https://id.example.test", ClientID: "toolgate", State: "s", Nonce: "n", Verifier: "v", Return: "/console/", Expiry: time.Now().Add(time.Minute).Unix()}
	before := &Handler{app: &gateway.App{StateSecret: oldSecret}}
	cookie := before.sealSignIn(st)

	rotated := &Handler{app: &gateway.App{StateSecret: newSecret, PreviousStateSecrets: []string{oldSecret}}}
	if got, ok := rotated.openSignIn(cookie); !ok || got != st {
		t.Fatalf("after rotation: %+v, %v", got, ok)
	}
	if got, ok := rotated.openSignIn(rotated.sealSignIn(st)); !ok || got != st {
		t.Fatalf("sealed with the new secret: %+v, %v", got, ok)
	}
	retired := &Handler{app: &gateway.App{StateSecret: newSecret}}
	if _, ok := retired.openSignIn(cookie); ok {
		t.Error("a cookie sealed with a removed secret opened")
	}
	tampered := []byte(cookie)
	tampered[len(tampered)/2] ^= 1
	if _, ok := rotated.openSignIn(string(tampered)); ok {
		t.Error("an altered cookie opened")
	}
	st.Expiry = time.Now().Add(-time.Second).Unix()
	if _, ok := rotated.openSignIn(before.sealSignIn(st)); ok {
		t.Error("an expired sign-in opened")
	}
}

// An OIDC issuer is https, or plain http to a loopback address only:
// whoever answers for it serves the keys sign-ins are verified with. Its
// errors never quote a password.
func TestOIDCIssuerURL(t *testing.T) {
	for issuer, want := range map[string]string{
		"https://id.example.com":             "",
		"http://127.0.0.1:9000/realms/x":     "",
		"http://localhost:9000":              "",
		"http://id.example.com":              "plain http is allowed only to a loopback address",
		"http://u:pw-secret@id.example.com":  "plain http is allowed only to a loopback address",
		"ftp://id.example.com":               "must be an absolute http(s) URL",
		"id.example.com":                     "must be an absolute http(s) URL",
		"https://u:pw-secret@id.example.com": "",
	} {
		err := (&OIDCIssuer{Issuer: issuer, ClientID: "toolgate"}).validate()
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", issuer, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: %v, want %q", issuer, err, want)
		case err != nil && strings.Contains(err.Error(), "pw-secret"):
			t.Errorf("%s: the error quotes the password: %v", issuer, err)
		}
	}
}
