package vaulttransit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/hashicorp/vault/api"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/toolgate/toolgate/modules/ciphers/vaulttransit/vaulttest"
	"github.com/toolgate/toolgate/modules/gateway"
)

func TestMain(m *testing.M) {
	code := m.Run()
	vaulttest.StopShared()
	os.Exit(code)
}

var (
	ctxAlice = gateway.CipherContext("tracker", "alice@example.com")
	ctxBob   = gateway.CipherContext("tracker", "bob@example.com")
)

// provision provisions and validates c like Caddy does, and replaces its
// logger with an observer whose entries the test can inspect.
func provision(t *testing.T, c *Cipher) *observer.ObservedLogs {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := c.Provision(ctx); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	c.logger = zap.New(core)
	t.Cleanup(func() { _ = c.Cleanup() })
	return logs
}

// started returns a provisioned and started cipher using a static token.
func started(t *testing.T, srv *vaulttest.Server, key string) *Cipher {
	t.Helper()
	c := &Cipher{Address: srv.Addr, Token: srv.RootToken, Key: key}
	provision(t, c)
	if err := c.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	return c
}

func encrypt(t *testing.T, c *Cipher, plaintext string, context []byte) []byte {
	t.Helper()
	ct, err := c.Encrypt(t.Context(), []byte(plaintext), context)
	if err != nil {
		t.Fatalf("Encrypt: %v", err)
	}
	return ct
}

// assertClean fails if any secret occurs in s.
func assertClean(t *testing.T, what, s string, secrets ...string) {
	t.Helper()
	for _, sec := range secrets {
		if sec != "" && strings.Contains(s, sec) {
			t.Errorf("%s contains a secret (%q): %s", what, sec, s)
		}
	}
}

// assertLogsClean fails if any logged message or field contains a secret.
func assertLogsClean(t *testing.T, logs *observer.ObservedLogs, secrets ...string) {
	t.Helper()
	for _, e := range logs.All() {
		line := e.Message
		for k, v := range e.ContextMap() {
			line += fmt.Sprintf(" %s=%v", k, v)
		}
		assertClean(t, "log line", line, secrets...)
	}
}

func TestRoundTrip(t *testing.T) {
	srv := vaulttest.Shared(t)
	c := started(t, srv, srv.NewKey(t))
	const secret = `{"access_token":"gho_round-trip-secret"}`

	ct := encrypt(t, c, secret, ctxAlice)
	if !bytes.HasPrefix(ct, []byte("vault:v1:")) {
		t.Errorf("ciphertext %q does not start with vault:v1:", ct)
	}
	if bytes.Contains(ct, []byte(secret)) || bytes.Contains(ct, []byte("round-trip-secret")) {
		t.Errorf("ciphertext contains the plaintext")
	}
	pt, err := c.Decrypt(t.Context(), ct, ctxAlice)
	if err != nil {
		t.Fatalf("Decrypt: %v", err)
	}
	if string(pt) != secret {
		t.Errorf("Decrypt = %q, want %q", pt, secret)
	}

	// The same plaintext encrypts differently each time.
	if ct2 := encrypt(t, c, secret, ctxAlice); bytes.Equal(ct, ct2) {
		t.Errorf("two encryptions gave the same ciphertext")
	}

	// Empty and binary plaintexts survive.
	for _, p := range []string{"", "\x00\xff\x10binary"} {
		ct := encrypt(t, c, p, ctxAlice)
		got, err := c.Decrypt(t.Context(), ct, ctxAlice)
		if err != nil || string(got) != p {
			t.Errorf("round trip of %q = %q, %v", p, got, err)
		}
	}
}

func TestWrongContextFails(t *testing.T) {
	srv := vaulttest.Shared(t)
	c := started(t, srv, srv.NewKey(t))
	const secret = "alice-only-secret"
	ct := encrypt(t, c, secret, ctxAlice)

	for name, context := range map[string][]byte{
		"other user":    ctxBob,
		"other service": gateway.CipherContext("search", "alice@example.com"),
		"empty":         nil,
	} {
		t.Run(name, func(t *testing.T) {
			pt, err := c.Decrypt(t.Context(), ct, context)
			if err == nil {
				t.Fatalf("Decrypt with another context succeeded: %q", pt)
			}
			if errors.Is(err, gateway.ErrCipherUnavailable) {
				t.Errorf("wrong-context error is marked unavailable (retryable): %v", err)
			}
			assertClean(t, "error", err.Error(), secret, string(ct), srv.RootToken)
		})
	}

	// A ciphertext from another key does not decrypt either.
	other := started(t, srv, srv.NewKey(t))
	if _, err := other.Decrypt(t.Context(), ct, ctxAlice); err == nil {
		t.Errorf("Decrypt with another key succeeded")
	}

	// Something that is not a transit ciphertext is refused without a call.
	if _, err := c.Decrypt(t.Context(), []byte("plain junk"), ctxAlice); err == nil || strings.Contains(err.Error(), "plain junk") {
		t.Errorf("Decrypt(junk) = %v", err)
	}
}

func TestRotation(t *testing.T) {
	srv := vaulttest.Shared(t)
	key := srv.NewKey(t)
	c := started(t, srv, key)

	old := encrypt(t, c, "before rotation", ctxAlice)
	srv.RotateKey(t, key)
	newer := encrypt(t, c, "after rotation", ctxAlice)

	if !bytes.HasPrefix(old, []byte("vault:v1:")) || !bytes.HasPrefix(newer, []byte("vault:v2:")) {
		t.Errorf("versions: old %q, new %q; want vault:v1: and vault:v2:", old[:9], newer[:9])
	}
	for ct, want := range map[string]string{string(old): "before rotation", string(newer): "after rotation"} {
		got, err := c.Decrypt(t.Context(), []byte(ct), ctxAlice)
		if err != nil || string(got) != want {
			t.Errorf("Decrypt(%s…) = %q, %v; want %q", ct[:9], got, err, want)
		}
	}
}

func TestPlaceholders(t *testing.T) {
	srv := vaulttest.Shared(t)
	key := srv.NewKey(t)
	t.Setenv("TOOLGATE_TEST_VAULT_ADDR", srv.Addr)
	t.Setenv("TOOLGATE_TEST_VAULT_TOKEN", srv.RootToken)
	t.Setenv("TOOLGATE_TEST_VAULT_KEY", key)
	c := &Cipher{
		Address: "{env.TOOLGATE_TEST_VAULT_ADDR}",
		Token:   "{env.TOOLGATE_TEST_VAULT_TOKEN}",
		Key:     "{env.TOOLGATE_TEST_VAULT_KEY}",
	}
	provision(t, c)
	if c.Token != "{env.TOOLGATE_TEST_VAULT_TOKEN}" {
		t.Errorf("Provision changed the configured token field to %q", c.Token)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	ct := encrypt(t, c, "x", ctxAlice)
	if pt, err := c.Decrypt(t.Context(), ct, ctxAlice); err != nil || string(pt) != "x" {
		t.Errorf("round trip = %q, %v", pt, err)
	}
}

func TestStartRejectsMisconfiguredKey(t *testing.T) {
	srv := vaulttest.Shared(t)

	t.Run("not derived", func(t *testing.T) {
		key := vaulttest.KeyName("plain")
		srv.CreateKey(t, key, false)
		c := &Cipher{Address: srv.Addr, Token: srv.RootToken, Key: key}
		provision(t, c)
		err := c.Start(t.Context())
		if err == nil {
			t.Fatal("Start accepted a key that is not derived")
		}
		want := "vault write -f transit/keys/<name> derived=true"
		if !strings.Contains(err.Error(), "not derived") || !strings.Contains(err.Error(), want) {
			t.Errorf("Start error %q should say the key is not derived and suggest %q", err, want)
		}
		if errors.Is(err, gateway.ErrCipherUnavailable) {
			t.Errorf("misconfiguration marked unavailable: %v", err)
		}
		// Calls refuse to work with it too.
		if _, err := c.Encrypt(t.Context(), []byte("x"), ctxAlice); err == nil {
			t.Error("Encrypt with a non-derived key succeeded")
		}
	})

	t.Run("missing", func(t *testing.T) {
		c := &Cipher{Address: srv.Addr, Token: srv.RootToken, Key: "no-such-key"}
		provision(t, c)
		err := c.Start(t.Context())
		if err == nil || !strings.Contains(err.Error(), "vault write -f transit/keys/no-such-key derived=true") {
			t.Errorf("Start with a missing key = %v; want the command that creates it", err)
		}
	})

	t.Run("engine not enabled", func(t *testing.T) {
		c := &Cipher{Address: srv.Addr, Token: srv.RootToken, Key: "k", Mount: "nowhere"}
		provision(t, c)
		err := c.Start(t.Context())
		if err == nil || errors.Is(err, gateway.ErrCipherUnavailable) || !strings.Contains(err.Error(), "nowhere") {
			t.Errorf("Start with a missing mount = %v", err)
		}
	})
}

// tokenWithPolicy creates a token whose only policy is rules.
func tokenWithPolicy(t *testing.T, srv *vaulttest.Server, rules string) string {
	t.Helper()
	root := srv.Client()
	name := "p-" + strings.ReplaceAll(t.Name(), "/", "-")
	if err := root.Sys().PutPolicy(name, rules); err != nil {
		t.Fatalf("PutPolicy: %v", err)
	}
	s, err := root.Auth().Token().Create(&api.TokenCreateRequest{Policies: []string{name}, NoDefaultPolicy: true})
	if err != nil {
		t.Fatalf("creating token: %v", err)
	}
	return s.Auth.ClientToken
}

func TestPermissionDenied(t *testing.T) {
	srv := vaulttest.Shared(t)
	key := srv.NewKey(t)

	t.Run("start needs read on the key", func(t *testing.T) {
		token := tokenWithPolicy(t, srv, fmt.Sprintf(`path "transit/encrypt/%s" { capabilities = ["update"] }`, key))
		c := &Cipher{Address: srv.Addr, Token: token, Key: key}
		provision(t, c)
		err := c.Start(t.Context())
		if err == nil {
			t.Fatal("Start succeeded without read on the key")
		}
		if errors.Is(err, gateway.ErrCipherUnavailable) {
			t.Errorf("permission denied marked unavailable: %v", err)
		}
		want := fmt.Sprintf(`"transit/keys/%s" { capabilities = ["read"] }`, key)
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q should name the policy path %s", err, want)
		}
		assertClean(t, "error", err.Error(), token)
	})

	t.Run("decrypt denied", func(t *testing.T) {
		token := tokenWithPolicy(t, srv, fmt.Sprintf(`
path "transit/keys/%[1]s"    { capabilities = ["read"] }
path "transit/encrypt/%[1]s" { capabilities = ["update"] }`, key))
		c := &Cipher{Address: srv.Addr, Token: token, Key: key}
		provision(t, c)
		if err := c.Start(t.Context()); err != nil {
			t.Fatalf("Start: %v", err)
		}
		ct := encrypt(t, c, "denied secret", ctxAlice)
		_, err := c.Decrypt(t.Context(), ct, ctxAlice)
		if err == nil {
			t.Fatal("Decrypt succeeded without permission")
		}
		if errors.Is(err, gateway.ErrCipherUnavailable) {
			t.Errorf("permission denied marked unavailable: %v", err)
		}
		want := fmt.Sprintf(`"transit/decrypt/%s" { capabilities = ["update"] }`, key)
		if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("error %q should say permission denied and name %s", err, want)
		}
		assertClean(t, "error", err.Error(), token, "denied secret", string(ct))
	})
}

// appRole enables AppRole at a fresh mount on srv and creates a role allowed
// to use key; it returns the mount, role_id and secret_id.
func appRole(t *testing.T, srv *vaulttest.Server, key string) (mount, roleID, secretID string) {
	t.Helper()
	root := srv.Client()
	mount = "approle-" + key
	if err := root.Sys().EnableAuthWithOptions(mount, &api.EnableAuthOptions{Type: "approle"}); err != nil {
		t.Fatalf("enabling approle: %v", err)
	}
	policy := "toolgate-" + key
	err := root.Sys().PutPolicy(policy, fmt.Sprintf(`
path "transit/keys/%[1]s"    { capabilities = ["read"] }
path "transit/encrypt/%[1]s" { capabilities = ["update"] }
path "transit/decrypt/%[1]s" { capabilities = ["update"] }`, key))
	if err != nil {
		t.Fatalf("PutPolicy: %v", err)
	}
	role := "auth/" + mount + "/role/toolgate"
	if _, err := root.Logical().Write(role, map[string]any{
		"token_policies": policy,
		"token_ttl":      "1h",
		"token_max_ttl":  "4h",
	}); err != nil {
		t.Fatalf("creating role: %v", err)
	}
	s, err := root.Logical().Read(role + "/role-id")
	if err != nil {
		t.Fatalf("reading role_id: %v", err)
	}
	roleID = s.Data["role_id"].(string)
	s, err = root.Logical().Write(role+"/secret-id", nil)
	if err != nil {
		t.Fatalf("generating secret_id: %v", err)
	}
	secretID = s.Data["secret_id"].(string)
	return mount, roleID, secretID
}

func TestAppRole(t *testing.T) {
	srv := vaulttest.Shared(t)
	key := srv.NewKey(t)
	mount, roleID, secretID := appRole(t, srv, key)
	t.Setenv("TOOLGATE_TEST_SECRET_ID", secretID)

	c := &Cipher{
		Address: srv.Addr,
		AppRole: &AppRole{RoleID: roleID, SecretID: "{env.TOOLGATE_TEST_SECRET_ID}", Mount: mount},
		Key:     key,
	}
	logs := provision(t, c)
	if err := c.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	const secret = "approle secret"
	ct := encrypt(t, c, secret, ctxAlice)
	if pt, err := c.Decrypt(t.Context(), ct, ctxAlice); err != nil || string(pt) != secret {
		t.Fatalf("round trip = %q, %v", pt, err)
	}

	t.Run("renews before expiry", func(t *testing.T) {
		gen, token := c.st.tokenGen.Load(), c.client.Token()
		c.st.refreshAt.Store(1) // due now
		encrypt(t, c, secret, ctxAlice)
		if c.st.tokenGen.Load() != gen || c.client.Token() != token {
			t.Errorf("token was replaced; want it renewed")
		}
		if c.needsRefresh() {
			t.Errorf("refresh not rescheduled")
		}
	})

	t.Run("logs in again near max ttl", func(t *testing.T) {
		gen := c.st.tokenGen.Load()
		c.st.mu.Lock()
		c.st.loginTTL = 100 * time.Hour // renewals now look too short
		c.st.mu.Unlock()
		c.st.refreshAt.Store(1)
		encrypt(t, c, secret, ctxAlice)
		if c.st.tokenGen.Load() != gen+1 {
			t.Errorf("no new login (generation %d → %d)", gen, c.st.tokenGen.Load())
		}
	})

	t.Run("logs in again after 403", func(t *testing.T) {
		gen := c.st.tokenGen.Load()
		if err := srv.Client().Auth().Token().RevokeTree(c.client.Token()); err != nil {
			t.Fatalf("revoking the cipher's token: %v", err)
		}
		ct := encrypt(t, c, secret, ctxBob)
		if pt, err := c.Decrypt(t.Context(), ct, ctxBob); err != nil || string(pt) != secret {
			t.Fatalf("round trip after revocation = %q, %v", pt, err)
		}
		if c.st.tokenGen.Load() != gen+1 {
			t.Errorf("generation %d → %d; want one new login", gen, c.st.tokenGen.Load())
		}
	})

	t.Run("concurrent refresh", func(t *testing.T) {
		c.st.refreshAt.Store(1)
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for range 16 {
			wg.Go(func() {
				ct, err := c.Encrypt(context.Background(), []byte(secret), ctxAlice)
				if err == nil {
					_, err = c.Decrypt(context.Background(), ct, ctxAlice)
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
	})

	assertLogsClean(t, logs, secretID, c.client.Token(), secret)

	t.Run("bad secret_id fails start", func(t *testing.T) {
		bad := "00000000-1111-2222-3333-444444444444"
		c := &Cipher{Address: srv.Addr, AppRole: &AppRole{RoleID: roleID, SecretID: bad, Mount: mount}, Key: key}
		provision(t, c)
		err := c.Start(t.Context())
		if err == nil || errors.Is(err, gateway.ErrCipherUnavailable) || !strings.Contains(err.Error(), "check role_id and secret_id") {
			t.Fatalf("Start with a bad secret_id = %v", err)
		}
		assertClean(t, "error", err.Error(), bad)
	})
}

// TestUnavailable runs on a server of its own, since it rate-limits, seals
// and finally stops it.
func TestUnavailable(t *testing.T) {
	srv := vaulttest.Start(t)
	key := srv.Key
	c := started(t, srv, key)
	const secret = "must never appear"
	ct := encrypt(t, c, secret, ctxAlice)

	check := func(t *testing.T, wantMsg string) {
		t.Helper()
		_, eerr := c.Encrypt(t.Context(), []byte(secret), ctxAlice)
		_, derr := c.Decrypt(t.Context(), ct, ctxAlice)
		for op, err := range map[string]error{"Encrypt": eerr, "Decrypt": derr} {
			if !errors.Is(err, gateway.ErrCipherUnavailable) {
				t.Errorf("%s error %v does not wrap ErrCipherUnavailable", op, err)
				continue
			}
			if !strings.Contains(err.Error(), wantMsg) {
				t.Errorf("%s error %q does not say %q", op, err, wantMsg)
			}
			assertClean(t, op+" error", err.Error(), secret, string(ct), srv.RootToken)
		}
	}

	t.Run("rate limited", func(t *testing.T) {
		root := srv.Client()
		if _, err := root.Logical().Write("sys/quotas/rate-limit/tight", map[string]any{
			"path": "transit/", "rate": 1, "interval": "1m", "block_interval": "1m",
		}); err != nil {
			t.Fatalf("creating quota: %v", err)
		}
		defer func() {
			if _, err := root.Logical().Delete("sys/quotas/rate-limit/tight"); err != nil {
				t.Fatalf("deleting quota: %v", err)
			}
		}()
		_, _ = c.Encrypt(t.Context(), []byte(secret), ctxAlice) // may use the one allowed request
		check(t, "rate limiting")
	})

	t.Run("sealed", func(t *testing.T) {
		srv.Seal(t)
		check(t, "is sealed: unseal it")
	})

	t.Run("stopped", func(t *testing.T) {
		srv.Stop()
		check(t, "is unreachable")
	})

	t.Run("start while unreachable", func(t *testing.T) {
		c := &Cipher{Address: srv.Addr, Token: srv.RootToken, Key: key}
		logs := provision(t, c)
		if err := c.Start(t.Context()); err != nil {
			t.Fatalf("Start with Vault down = %v; want a warning and nil", err)
		}
		if logs.FilterLevelExact(zapcore.WarnLevel).Len() != 1 {
			t.Errorf("want one warning, got %v", logs.All())
		}
		assertLogsClean(t, logs, srv.RootToken)
		if _, err := c.Encrypt(t.Context(), []byte(secret), ctxAlice); !errors.Is(err, gateway.ErrCipherUnavailable) {
			t.Errorf("Encrypt after such a start = %v; want unavailable", err)
		}
	})
}

// TestRecoversAfterOutage checks that a cipher started during an outage does
// its key check once Vault is back, before encrypting anything.
func TestRecoversAfterOutage(t *testing.T) {
	srv := vaulttest.Shared(t)
	key := vaulttest.KeyName("late")
	c := &Cipher{Address: srv.Addr, Token: srv.RootToken, Key: key}
	provision(t, c)
	// The key does not exist yet; pretend Start saw an outage.
	if c.st.ready.Load() {
		t.Fatal("ready before Start")
	}
	if _, err := c.Encrypt(t.Context(), []byte("x"), ctxAlice); err == nil || !strings.Contains(err.Error(), "derived=true") {
		t.Fatalf("Encrypt before the key exists = %v", err)
	}
	srv.CreateKey(t, key, true)
	ct := encrypt(t, c, "x", ctxAlice)
	if pt, err := c.Decrypt(t.Context(), ct, ctxAlice); err != nil || string(pt) != "x" {
		t.Fatalf("round trip = %q, %v", pt, err)
	}
}

func TestTimeout(t *testing.T) {
	// A listener that accepts connections and never answers.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	c := &Cipher{Address: "http://" + l.Addr().String(), Token: "hvs.static-token", Key: "k", Timeout: caddy.Duration(200 * time.Millisecond)}
	provision(t, c)
	start := time.Now()
	_, err = c.Encrypt(t.Context(), []byte("secret"), ctxAlice)
	if !errors.Is(err, gateway.ErrCipherUnavailable) || !strings.Contains(err.Error(), "did not answer") {
		t.Errorf("Encrypt against a silent server = %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Encrypt took %s with a 200ms timeout", d)
	}
}

func TestProvisionAndValidate(t *testing.T) {
	t.Setenv("TOOLGATE_TEST_EMPTY", "")
	for _, tc := range []struct {
		name string
		c    Cipher
		want string // substring of the error; "" means valid
	}{
		{"token", Cipher{Address: "http://127.0.0.1:1", Token: "t", Key: "k"}, ""},
		{"approle", Cipher{Address: "https://vault:8200", AppRole: &AppRole{RoleID: "r", SecretID: "s"}, Key: "k"}, ""},
		{"no address", Cipher{Token: "t", Key: "k"}, "address is required"},
		{"address placeholder empty", Cipher{Address: "{env.TOOLGATE_TEST_EMPTY}", Token: "t", Key: "k"}, "empty once placeholders"},
		{"bad scheme", Cipher{Address: "vault:8200", Token: "t", Key: "k"}, "must start with https://"},
		{"plain http to another host", Cipher{Address: "http://vault.example.com:8200", Token: "t", Key: "k"}, "plain http is allowed only to a loopback address"},
		{"plain http to localhost", Cipher{Address: "http://localhost:8200", Token: "t", Key: "k"}, ""},
		{"userinfo in address", Cipher{Address: "http://toolgate:s3cret@vault:8200", Token: "t", Key: "k"}, `"http://xxxxx@vault:8200" must not carry a user or password`},
		{"no key", Cipher{Address: "https://v", Token: "t"}, "key is required"},
		{"no auth", Cipher{Address: "https://v", Key: "k"}, "one of token or approle"},
		{"both auths", Cipher{Address: "https://v", Key: "k", Token: "t", AppRole: &AppRole{RoleID: "r"}}, "not both"},
		{"token placeholder empty", Cipher{Address: "https://v", Key: "k", Token: "{env.TOOLGATE_TEST_EMPTY}"}, "token is empty once placeholders are replaced"},
		{"approle without role_id", Cipher{Address: "https://v", Key: "k", AppRole: &AppRole{SecretID: "s"}}, "role_id is required"},
		{"key with slash", Cipher{Address: "https://v", Token: "t", Key: "a/b"}, "must not contain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			c := tc.c
			err := c.Provision(ctx)
			if err == nil {
				err = c.Validate()
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error = %v; want it to contain %q", err, tc.want)
			}
			if tc.want == "" {
				if c.mount != DefaultMount || c.timeout != DefaultTimeout {
					t.Errorf("defaults: mount %q timeout %s", c.mount, c.timeout)
				}
				if c.AppRole != nil && c.approleMount != DefaultAppRoleMount {
					t.Errorf("approle mount default = %q", c.approleMount)
				}
			}
		})
	}
}

func TestIgnoresVaultEnvironment(t *testing.T) {
	t.Setenv("VAULT_TOKEN", "from-env")
	t.Setenv("VAULT_NAMESPACE", "from-env")
	c := &Cipher{Address: "http://127.0.0.1:1", AppRole: &AppRole{RoleID: "r"}, Key: "k"}
	provision(t, c)
	if tok := c.client.Token(); tok != "" {
		t.Errorf("client token = %q; want none before login", tok)
	}
	if tok := c.loginClient.Token(); tok != "" {
		t.Errorf("login client token = %q; want none", tok)
	}
	if ns := c.client.Namespace(); ns != "" {
		t.Errorf("namespace = %q; want none", ns)
	}
}

func TestModuleInfo(t *testing.T) {
	info := Cipher{}.CaddyModule()
	if info.ID != "toolgate.ciphers.vault_transit" {
		t.Errorf("ID = %q", info.ID)
	}
	if _, ok := info.New().(*Cipher); !ok {
		t.Errorf("New() = %T", info.New())
	}
	if _, err := caddy.GetModule("toolgate.ciphers.vault_transit"); err != nil {
		t.Errorf("not registered: %v", err)
	}
}
