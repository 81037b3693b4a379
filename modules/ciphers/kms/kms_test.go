package kms

import (
	"bytes"
	"context"
	"errors"
	"net"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	awskms "github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/toolgate/toolgate/modules/ciphers/kms/kmstest"
	"github.com/toolgate/toolgate/modules/gateway"
)

var (
	ctxAlice = gateway.CipherContext("tracker", "alice@example.com")
	ctxBob   = gateway.CipherContext("tracker", "bob@example.com")
)

// stored is the shape of every stored value.
var stored = regexp.MustCompile(`^kms:v1:[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$`)

// counted is the real KMS client with a count of its requests.
type counted struct {
	kmsAPI
	generates, decrypts atomic.Int64
}

func (c *counted) GenerateDataKey(ctx context.Context, in *awskms.GenerateDataKeyInput, opts ...func(*awskms.Options)) (*awskms.GenerateDataKeyOutput, error) {
	c.generates.Add(1)
	return c.kmsAPI.GenerateDataKey(ctx, in, opts...)
}

func (c *counted) Decrypt(ctx context.Context, in *awskms.DecryptInput, opts ...func(*awskms.Options)) (*awskms.DecryptOutput, error) {
	c.decrypts.Add(1)
	return c.kmsAPI.Decrypt(ctx, in, opts...)
}

// provision provisions and validates c like Caddy does, counts its KMS
// requests, and replaces its logger with an observer.
func provision(t *testing.T, c *Cipher) (*counted, *observer.ObservedLogs) {
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
	api := &counted{kmsAPI: c.client}
	c.client = api
	t.Cleanup(func() { _ = c.Cleanup() })
	return api, logs
}

// started returns a provisioned and started cipher for key on srv.
func started(t *testing.T, srv *kmstest.Server, keyURL string) (*Cipher, *counted, *observer.ObservedLogs) {
	t.Helper()
	c := &Cipher{KeyURL: keyURL, Endpoint: srv.Endpoint, Region: kmstest.Region}
	api, logs := provision(t, c)
	if err := c.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	api.generates.Store(0)
	api.decrypts.Store(0)
	return c, api, logs
}

func arnURL(arn string) string { return "awskms:///" + arn }

func encrypt(t *testing.T, c *Cipher, plaintext []byte, record []byte) []byte {
	t.Helper()
	ct, err := c.Encrypt(t.Context(), plaintext, record)
	if err != nil {
		t.Fatalf("Encrypt: %v", err)
	}
	if !stored.Match(ct) {
		t.Fatalf("Encrypt returned %.80q…, not a kms:v1 envelope", ct)
	}
	return ct
}

func decrypt(t *testing.T, c *Cipher, ct, record []byte, want []byte) {
	t.Helper()
	pt, err := c.Decrypt(t.Context(), ct, record)
	if err != nil {
		t.Fatalf("Decrypt: %v", err)
	}
	if !bytes.Equal(pt, want) {
		t.Fatalf("Decrypt returned %d bytes, not the %d encrypted", len(pt), len(want))
	}
}

// assertClean fails if any secret occurs in s.
func assertClean(t *testing.T, what, s string, secrets ...string) {
	t.Helper()
	for _, sec := range secrets {
		if sec != "" && strings.Contains(s, sec) {
			t.Errorf("%s contains a secret (%.20q…): %.200s", what, sec, s)
		}
	}
}

// assertLogsClean fails if any log entry mentions a secret.
func assertLogsClean(t *testing.T, logs *observer.ObservedLogs, secrets ...string) {
	t.Helper()
	for _, e := range logs.All() {
		line := e.Message
		for k, v := range e.ContextMap() {
			line += " " + k + "=" + strings.ReplaceAll(strings.TrimSpace(toString(v)), "\n", " ")
		}
		assertClean(t, "log entry", line, secrets...)
	}
}

func toString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	if e, ok := v.(error); ok {
		return e.Error()
	}
	return ""
}

// secretText is a recognizable plaintext of n bytes.
func secretText(n int) []byte {
	b := bytes.Repeat([]byte("s3cr3t-"), n/7+1)[:n]
	return b
}

func TestRoundTrip(t *testing.T) {
	srv := kmstest.Start(t)
	key := srv.NewKey(t)
	c, api, logs := started(t, srv, arnURL(key))
	cold, _, _ := started(t, srv, arnURL(key))

	for _, n := range []int{0, 1, 4096, 16 << 10, 1 << 20} {
		plain := secretText(n)
		ct := encrypt(t, c, plain, ctxAlice)
		env, err := parseEnvelope(ct)
		if err != nil {
			t.Fatal(err)
		}
		if env.keyID != key {
			t.Errorf("stored key id %q, want the key ARN %q", env.keyID, key)
		}
		if n >= 16 && bytes.Contains(ct, plain[:16]) {
			t.Errorf("%d bytes: the stored form contains the plaintext", n)
		}
		decrypt(t, c, ct, ctxAlice, plain)
		decrypt(t, cold, ct, ctxAlice, plain) // a cold cache asks KMS
		again := encrypt(t, c, plain, ctxAlice)
		if e2, _ := parseEnvelope(again); bytes.Equal(e2.wrapped, env.wrapped) {
			t.Errorf("%d bytes: two values share a data key", n)
		}
	}
	if g := api.generates.Load(); g != 10 {
		t.Errorf("%d GenerateDataKey requests for 10 values, want one each", g)
	}
	if d := api.decrypts.Load(); d != 0 {
		t.Errorf("%d Decrypt requests for values this cipher wrote itself, want none (cached)", d)
	}
	assertLogsClean(t, logs, string(secretText(64)))
}

func TestRecordBinding(t *testing.T) {
	srv := kmstest.Start(t)
	key := srv.NewKey(t)
	c, _, _ := started(t, srv, arnURL(key))
	plain := []byte(`{"access_token":"alice-token-0123456789"}`)
	ct := encrypt(t, c, plain, ctxAlice)

	t.Run("another user's record", func(t *testing.T) {
		for name, ci := range map[string]*Cipher{"warm": c, "cold": func() *Cipher { c, _, _ := started(t, srv, arnURL(key)); return c }()} {
			_, err := ci.Decrypt(t.Context(), ct, ctxBob)
			if !errors.Is(err, errWrongContext) || errors.Is(err, gateway.ErrCipherUnavailable) {
				t.Errorf("%s cache: decrypting alice's value as bob's = %v; want a wrong-context error that is not retryable", name, err)
			}
		}
	})

	t.Run("KMS refuses another context", func(t *testing.T) {
		cold, api, _ := started(t, srv, arnURL(key))
		_, err := cold.Decrypt(t.Context(), ct, ctxBob)
		if api.decrypts.Load() != 1 || err == nil || !strings.Contains(err.Error(), "InvalidCiphertextException") {
			t.Errorf("KMS was asked %d times, error %v; want KMS itself to refuse the data key for bob", api.decrypts.Load(), err)
		}
	})

	t.Run("changed values", func(t *testing.T) {
		other := encrypt(t, c, plain, ctxBob)
		key2 := srv.NewKey(t)
		e, _ := parseEnvelope(ct)
		parts := strings.Split(strings.TrimPrefix(string(ct), prefix), ".")
		bparts := strings.Split(strings.TrimPrefix(string(other), prefix), ".")
		flipped := bytes.Clone(e.sealed)
		flipped[len(flipped)-1] ^= 1
		for name, bad := range map[string]string{
			"other key id":           prefix + b64.EncodeToString([]byte(key2)) + "." + parts[1] + "." + parts[2],
			"bob's wrapped data key": prefix + parts[0] + "." + bparts[1] + "." + parts[2],
			"bob's sealed value":     prefix + parts[0] + "." + parts[1] + "." + bparts[2],
			"one bit of the value":   prefix + parts[0] + "." + parts[1] + "." + b64.EncodeToString(flipped),
			"version tag":            "kms:v2:" + parts[0] + "." + parts[1] + "." + parts[2],
			"vault ciphertext":       "vault:v1:abcd",
			"wrapped key not base64": prefix + parts[0] + ".%%%." + parts[2],
			"truncated":              string(ct[:len(ct)-40]),
			"empty wrapped data key": prefix + parts[0] + ".." + parts[2],
			"bob's whole header":     prefix + bparts[0] + "." + bparts[1] + "." + parts[2],
		} {
			for _, ci := range []*Cipher{c, func() *Cipher { c, _, _ := started(t, srv, arnURL(key)); return c }()} {
				if pt, err := ci.Decrypt(t.Context(), []byte(bad), ctxAlice); err == nil || errors.Is(err, gateway.ErrCipherUnavailable) {
					t.Errorf("%s: Decrypt = %q, %v; want a permanent error", name, pt, err)
				}
			}
		}
	})
}

// fakeClock moves the cache's clock forward by an offset; restored when t
// ends.
func fakeClock(t *testing.T) func(time.Duration) {
	var offset atomic.Int64
	real := now
	now = func() time.Time { return real().Add(time.Duration(offset.Load())) }
	t.Cleanup(func() { now = real })
	return func(d time.Duration) { offset.Add(int64(d)) }
}

func TestDataKeyCache(t *testing.T) {
	advance := fakeClock(t)
	srv := kmstest.Start(t)
	key := srv.NewKey(t)
	writer, _, _ := started(t, srv, arnURL(key))
	plain := []byte("cached value")
	records := [][]byte{ctxAlice, ctxBob, gateway.CipherContext("mail", "carol@example.com")}
	var cts [][]byte
	for _, r := range records {
		cts = append(cts, encrypt(t, writer, plain, r))
	}

	c, api, _ := started(t, srv, arnURL(key))
	for range 3 {
		decrypt(t, c, cts[0], ctxAlice, plain)
	}
	if n := api.decrypts.Load(); n != 1 {
		t.Fatalf("three reads of one record asked KMS %d times, want 1", n)
	}

	t.Run("concurrent reads share one request", func(t *testing.T) {
		cold, api, _ := started(t, srv, arnURL(key))
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for range 16 {
			wg.Go(func() {
				pt, err := cold.Decrypt(context.Background(), cts[1], ctxBob)
				if err == nil && !bytes.Equal(pt, plain) {
					err = errors.New("wrong plaintext")
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
		if n := api.decrypts.Load(); n != 1 {
			t.Errorf("16 concurrent reads asked KMS %d times, want 1", n)
		}
	})

	t.Run("time bound", func(t *testing.T) {
		advance(DefaultCacheTTL - time.Second)
		decrypt(t, c, cts[0], ctxAlice, plain)
		if n := api.decrypts.Load(); n != 1 {
			t.Fatalf("a read within cache_ttl asked KMS (%d requests)", n)
		}
		advance(2 * time.Second)
		decrypt(t, c, cts[0], ctxAlice, plain)
		if n := api.decrypts.Load(); n != 2 {
			t.Fatalf("a read after cache_ttl made %d requests in all, want 2", n)
		}
	})

	t.Run("count bound", func(t *testing.T) {
		small := &Cipher{KeyURL: arnURL(key), Endpoint: srv.Endpoint, CacheSize: 2}
		api, _ := provision(t, small)
		for i, r := range records {
			decrypt(t, small, cts[i], r, plain)
		}
		if n := small.cache.len(); n != 2 {
			t.Errorf("the cache holds %d keys, want at most cache_size 2", n)
		}
		decrypt(t, small, cts[2], records[2], plain) // the newest: cached
		decrypt(t, small, cts[0], records[0], plain) // the oldest: dropped
		if n := api.decrypts.Load(); n != 4 {
			t.Errorf("%d Decrypt requests, want 4 (3 records, the oldest again)", n)
		}
	})

	t.Run("cleanup forgets", func(t *testing.T) {
		_ = c.Cleanup()
		if n := c.cache.len(); n != 0 {
			t.Errorf("%d keys cached after Cleanup", n)
		}
	})
}

func TestRotation(t *testing.T) {
	srv := kmstest.Start(t)
	keyA, keyB, keyC := srv.NewKey(t), srv.NewKey(t), srv.NewKey(t)
	srv.SetAlias(t, "toolgate-rotation", keyA)
	c, _, _ := started(t, srv, "awskms://alias/toolgate-rotation")
	v1 := encrypt(t, c, []byte("under A"), ctxAlice)

	// The alias moves: new values use the new key, old ones still open.
	srv.SetAlias(t, "toolgate-rotation", keyB)
	v2 := encrypt(t, c, []byte("under B"), ctxAlice)
	for v, want := range map[string]string{string(v1): keyA, string(v2): keyB} {
		if e, _ := parseEnvelope([]byte(v)); e.keyID != want {
			t.Errorf("stored key id %q, want %q", e.keyID, want)
		}
	}

	// The configuration names a new key: the same.
	next, api, _ := started(t, srv, arnURL(keyC)+"?region="+kmstest.Region)
	decrypt(t, next, v1, ctxAlice, []byte("under A"))
	decrypt(t, next, v2, ctxAlice, []byte("under B"))
	v3 := encrypt(t, next, []byte("under C"), ctxAlice)
	if e, _ := parseEnvelope(v3); e.keyID != keyC {
		t.Errorf("a value written after the change names key %q, want %q", e.keyID, keyC)
	}
	if n := api.decrypts.Load(); n != 2 {
		t.Errorf("%d Decrypt requests for two old values, want 2", n)
	}

	// A disabled old key: its values fail as retryable, the others work.
	srv.DisableKey(t, keyA)
	cold, _, _ := started(t, srv, arnURL(keyC))
	if _, err := cold.Decrypt(t.Context(), v1, ctxAlice); !errors.Is(err, gateway.ErrCipherUnavailable) || !strings.Contains(err.Error(), "is disabled") {
		t.Errorf("a value under a disabled old key = %v; want retryable, naming the disabled key", err)
	}
	decrypt(t, cold, v2, ctxAlice, []byte("under B"))
}

func TestUnavailable(t *testing.T) {
	advance := fakeClock(t)
	srv := kmstest.Start(t)
	key := srv.NewKey(t)
	c, _, logs := started(t, srv, arnURL(key))
	plain := secretText(100)
	ct := encrypt(t, c, plain, ctxAlice)

	check := func(t *testing.T, ci *Cipher, wantMsg string) {
		t.Helper()
		_, eerr := ci.Encrypt(t.Context(), plain, ctxBob)
		_, derr := ci.Decrypt(t.Context(), ct, ctxAlice)
		for op, err := range map[string]error{"Encrypt": eerr, "Decrypt": derr} {
			if !errors.Is(err, gateway.ErrCipherUnavailable) {
				t.Errorf("%s error %v does not wrap ErrCipherUnavailable", op, err)
				continue
			}
			if !strings.Contains(err.Error(), wantMsg) {
				t.Errorf("%s error %q does not say %q", op, err, wantMsg)
			}
			assertClean(t, op+" error", err.Error(), string(plain), string(ct))
		}
	}
	cold := func() *Cipher {
		c := &Cipher{KeyURL: arnURL(key), Endpoint: srv.Endpoint, Timeout: caddy.Duration(2 * time.Second)}
		provision(t, c)
		return c
	}

	t.Run("key disabled", func(t *testing.T) {
		srv.DisableKey(t, key)
		check(t, cold(), "is disabled: enable it")
		srv.EnableKey(t, key)
		decrypt(t, cold(), ct, ctxAlice, plain)
	})

	t.Run("stopped", func(t *testing.T) {
		down := cold()
		ctxCarol := gateway.CipherContext("tracker", "carol@example.com")
		decrypt(t, c, ct, ctxAlice, plain)
		carol := encrypt(t, c, plain, ctxCarol)
		decrypt(t, c, carol, ctxCarol, plain)
		srv.Stop()
		check(t, down, "is unreachable")

		// A record just read can still be stored once more (an OAuth
		// refresh), under the data key it was read with.
		refreshed := encrypt(t, c, []byte("refreshed during the outage"), ctxAlice)
		if _, err := c.Encrypt(t.Context(), plain, ctxAlice); !errors.Is(err, gateway.ErrCipherUnavailable) {
			t.Errorf("a second write without a read in between = %v; want retryable", err)
		}
		if _, err := c.Encrypt(t.Context(), plain, ctxBob); !errors.Is(err, gateway.ErrCipherUnavailable) {
			t.Errorf("a record never read, during the outage = %v; want retryable", err)
		}
		if logs.FilterMessageSnippet("data key it was just read with").Len() != 1 {
			t.Errorf("want one warning about the stand-in key, got %v", logs.All())
		}

		// Past cache_ttl nothing is read; past the grace nothing is sealed.
		decrypt(t, c, ct, ctxAlice, plain)
		advance(DefaultCacheTTL)
		if _, err := c.Decrypt(t.Context(), ct, ctxAlice); !errors.Is(err, gateway.ErrCipherUnavailable) {
			t.Errorf("a read after cache_ttl during the outage = %v; want retryable", err)
		}
		encrypt(t, c, []byte("within the grace"), ctxAlice)
		advance(staleGrace)
		if _, err := c.Encrypt(t.Context(), plain, ctxCarol); !errors.Is(err, gateway.ErrCipherUnavailable) {
			t.Errorf("a write past the grace during the outage = %v; want retryable", err)
		}

		srv.Restart(t)
		decrypt(t, down, ct, ctxAlice, plain)
		decrypt(t, cold(), refreshed, ctxAlice, []byte("refreshed during the outage"))
		encrypt(t, down, plain, ctxBob)
	})

	t.Run("start while unreachable", func(t *testing.T) {
		srv.Stop()
		defer srv.Restart(t)
		c := &Cipher{KeyURL: arnURL(key), Endpoint: srv.Endpoint}
		_, logs := provision(t, c)
		if err := c.Start(t.Context()); err != nil {
			t.Fatalf("Start with KMS down = %v; want a warning and nil", err)
		}
		if logs.FilterLevelExact(zapcore.WarnLevel).Len() != 1 {
			t.Errorf("want one warning, got %v", logs.All())
		}
	})
	assertLogsClean(t, logs, string(plain))
}

func TestStartRefusesAMissingKey(t *testing.T) {
	srv := kmstest.Start(t)
	key := srv.NewKey(t)
	missing := key[:strings.LastIndex(key, "/")+1] + "00000000-0000-4000-8000-000000000000"
	for _, keyURL := range []string{arnURL(missing), "awskms://alias/no-such-alias"} {
		c := &Cipher{KeyURL: keyURL, Endpoint: srv.Endpoint, Region: kmstest.Region}
		provision(t, c)
		err := c.Start(t.Context())
		if err == nil || errors.Is(err, gateway.ErrCipherUnavailable) || !strings.Contains(err.Error(), "check key_url and region") {
			t.Errorf("%s: Start = %v; want a permanent error naming the fix", keyURL, err)
		}
	}
}

func TestTimeout(t *testing.T) {
	kmstest.Environ(t)
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
	c := &Cipher{KeyURL: "awskms://alias/x", Region: "eu-west-2", Endpoint: "http://" + l.Addr().String(), Timeout: caddy.Duration(200 * time.Millisecond)}
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

func TestModuleInfo(t *testing.T) {
	info := Cipher{}.CaddyModule()
	if info.ID != "toolgate.ciphers.kms" {
		t.Errorf("ID = %q", info.ID)
	}
	if _, ok := info.New().(*Cipher); !ok {
		t.Errorf("New() = %T", info.New())
	}
	if _, err := caddy.GetModule("toolgate.ciphers.kms"); err != nil {
		t.Errorf("not registered: %v", err)
	}
}
