package policy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"
	"go.uber.org/zap"
)

// signingKey is an RSA key pair: the private key in PEM, and the file of
// its public key.
func signingKey(t *testing.T) (private string, publicFile string) {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	publicFile = filepath.Join(t.TempDir(), "bundle.pub.pem")
	if err := os.WriteFile(publicFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)})), publicFile
}

// signedBundle is a bundle of module signed with private (RS256), as
// `opa build --signing-key` signs one; tamper changes its module after it
// was signed.
func signedBundle(t *testing.T, module, private string, tamper bool) []byte {
	t.Helper()
	b := bundle.Bundle{
		Manifest: bundle.Manifest{Revision: "signed"},
		Modules:  []bundle.ModuleFile{{URL: "/policy.rego", Path: "/policy.rego", Raw: []byte(module)}},
		Data:     map[string]any{},
	}
	if private != "" {
		if err := b.GenerateSignature(bundle.NewSigningConfig(private, "RS256", ""), "release-key", false); err != nil {
			t.Fatal(err)
		}
	}
	if tamper {
		b.Modules[0].Raw = []byte(strings.Replace(module, "deny", "allow", 1))
	}
	var buf bytes.Buffer
	if err := bundle.NewWriter(&buf).Write(b); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// With verification_key, a bundle loads only when it is signed with that
// key and unchanged since: an unsigned bundle, one signed with another
// key, and one altered after it was signed are load failures, and the
// last good policy stays.
func TestSignedBundles(t *testing.T) {
	private, publicFile := signingKey(t)
	other, _ := signingKey(t)
	const deny = "package toolgate.request\n\ndecision := {\"action\": \"deny\", \"reason\": \"signed\"}\n"
	var serve atomic.Value
	serve.Store(signedBundle(t, deny, private, false))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(serve.Load().([]byte))
	}))
	defer srv.Close()

	c := &Config{Source: srv.URL + "/bundle.tar.gz", VerificationKey: publicFile}
	verify, _, err := c.verification(true)
	if err != nil {
		t.Fatal(err)
	}
	src := newSource(c.Source).(*bundleSource)
	src.verify = verify
	e, err := newEngine(src, requestQuery, "test-signed", evaluatorPlan, 0, zap.NewNop(), policyMetrics)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Destruct()
	ctx := context.Background()
	if err := e.reload(ctx); err != nil {
		t.Fatalf("a bundle signed with the key: %v", err)
	}
	if o := e.decide(ctx, someInput, time.Minute, "arguments"); o.Reason != "signed" {
		t.Fatalf("decision %+v", o)
	}
	for name, b := range map[string][]byte{
		"unsigned":            signedBundle(t, strings.Replace(deny, "signed", "unsigned", 1), "", false),
		"signed with another": signedBundle(t, strings.Replace(deny, "signed", "other key", 1), other, false),
		"altered once signed": signedBundle(t, deny, private, true),
	} {
		serve.Store(b)
		if err := e.reload(ctx); err == nil {
			t.Errorf("%s: loaded", name)
		}
		if o := e.decide(ctx, someInput, time.Minute, "arguments"); o.Reason != "signed" || o.Action != "deny" {
			t.Errorf("%s: decision %+v, want the last good policy's", name, o)
		}
	}

	// Refused configurations: a local source, a key that is not PEM, an
	// unknown algorithm.
	notPEM := filepath.Join(t.TempDir(), "key.txt")
	if err := os.WriteFile(notPEM, []byte("not a key"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		c      Config
		remote bool
		want   string
	}{
		{Config{VerificationKey: publicFile}, false, "local file"},
		{Config{VerificationKey: notPEM}, true, "no PEM public key"},
		{Config{VerificationKey: publicFile, VerificationAlgorithm: "none"}, true, "unknown algorithm"},
		{Config{VerificationKey: filepath.Join(t.TempDir(), "missing.pem")}, true, "no such file"},
	} {
		if _, _, err := bad.c.verification(bad.remote); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want an error about %q", bad.c, err, bad.want)
		}
	}
}

// Attack (fixed): toolgate policy eval --config loaded the configured
// bundle without its verification_key, and printed decisions of an
// unsigned (or foreign-signed) bundle the gateway refuses to load.
// Fixed: eval verifies the bundle with the configured key, as the gateway does.
func TestPolicyEvalVerifiesAsTheGatewayDoes(t *testing.T) {
	private, publicFile := signingKey(t)
	other, _ := signingKey(t)
	const deny = "package toolgate.request\n\ndecision := {\"action\": \"deny\", \"reason\": \"signed\"}\n"
	var serve atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(serve.Load().([]byte))
	}))
	defer srv.Close()
	dir := t.TempDir()
	input := filepath.Join(dir, "input.json")
	caddyfile := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(input, []byte(`{"method": "tools/call", "arguments": {}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caddyfile, []byte(":8080 {\n\troute {\n\t\ttoolgate_policy {\n\t\t\tsource "+srv.URL+
		"/bundle.tar.gz\n\t\t\tverification_key "+publicFile+"\n\t\t}\n\t}\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	serve.Store(signedBundle(t, deny, private, false))
	if out, err := policyEval(input, caddyfile, "caddyfile", Config{}, "", nil); err != nil || out.Reason != "signed" {
		t.Fatalf("a bundle signed with the configured key: %+v %v", out, err)
	}
	for name, b := range map[string][]byte{
		"unsigned":            signedBundle(t, strings.Replace(deny, "signed", "unsigned", 1), "", false),
		"signed with another": signedBundle(t, strings.Replace(deny, "signed", "other key", 1), other, false),
	} {
		serve.Store(b)
		if out, err := policyEval(input, caddyfile, "caddyfile", Config{}, "", nil); err == nil {
			t.Errorf("%s: evaluated, %+v, where the gateway refuses the bundle", name, out)
		}
		if out, err := policyEval(input, "", "", Config{Source: srv.URL + "/bundle.tar.gz", VerificationKey: publicFile}, "", nil); err == nil {
			t.Errorf("%s, with --policy and --verification-key: evaluated, %+v", name, out)
		}
	}
	// --policy names a signed bundle with its key.
	serve.Store(signedBundle(t, deny, private, false))
	if out, err := policyEval(input, "", "", Config{Source: srv.URL + "/bundle.tar.gz", VerificationKey: publicFile}, "", nil); err != nil || out.Reason != "signed" {
		t.Errorf("--policy with --verification-key: %+v %v", out, err)
	}
	if _, err := policyEval(input, caddyfile, "caddyfile", Config{VerificationKey: publicFile}, "", nil); err == nil {
		t.Error("--verification-key with --config: accepted")
	}
}
