package kms

import (
	"bytes"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
)

// testKey is an unwrapped data key for format tests; the wrapped form is
// made up, as no KMS is involved.
func testAEADAndHeader(t testing.TB) (func() []byte, string) {
	t.Helper()
	key := make([]byte, dataKeySize)
	_, _ = rand.Read(key)
	keyCopy := bytes.Clone(key)
	header := envelopeHeader("arn:aws:kms:eu-west-2:111122223333:key/0b5d0f4e-0000-4000-8000-000000000001", []byte("wrapped-data-key-blob"))
	return func() []byte { return bytes.Clone(keyCopy) }, header
}

func TestEnvelopeFormat(t *testing.T) {
	key, header := testAEADAndHeader(t)
	aead, err := newAEAD(key())
	if err != nil {
		t.Fatal(err)
	}
	record := []byte("toolgate/v1/tracker/alice@example.com")
	out, err := seal(aead, header, []byte("the grant"), record)
	if err != nil {
		t.Fatal(err)
	}
	if !stored.Match(out) || !strings.HasPrefix(string(out), "kms:v1:") {
		t.Fatalf("stored form %q", out)
	}
	env, err := parseEnvelope(out)
	if err != nil {
		t.Fatal(err)
	}
	if env.keyID != "arn:aws:kms:eu-west-2:111122223333:key/0b5d0f4e-0000-4000-8000-000000000001" ||
		string(env.wrapped) != "wrapped-data-key-blob" || env.header != header ||
		len(env.sealed) != gcmNonceSize+len("the grant")+gcmTagSize {
		t.Fatalf("parsed %+v", env)
	}
	if pt, err := env.open(aead, record); err != nil || string(pt) != "the grant" {
		t.Fatalf("open = %q, %v", pt, err)
	}
	if _, err := env.open(aead, []byte("toolgate/v1/tracker/bob@example.com")); !errors.Is(err, errWrongContext) {
		t.Errorf("open for another record = %v", err)
	}

	// The header is authenticated: the same sealed bytes under another
	// key id or wrapped key do not open, even with the right data key.
	parts := strings.Split(strings.TrimPrefix(string(out), prefix), ".")
	for name, s := range map[string]string{
		"key id":  prefix + b64.EncodeToString([]byte("arn:aws:kms:eu-west-2:111122223333:key/other")) + "." + parts[1] + "." + parts[2],
		"wrapped": prefix + parts[0] + "." + b64.EncodeToString([]byte("another-blob")) + "." + parts[2],
	} {
		env, err := parseEnvelope([]byte(s))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := env.open(aead, record); !errors.Is(err, errWrongContext) {
			t.Errorf("changed %s: open = %v; want it refused", name, err)
		}
	}

	// The data key is cleared once the cipher is made.
	k := key()
	if _, err := newAEAD(k); err != nil || !bytes.Equal(k, make([]byte, dataKeySize)) {
		t.Errorf("newAEAD left the key bytes in place (err %v)", err)
	}
	if _, err := newAEAD(make([]byte, 16)); err == nil {
		t.Error("a 128-bit data key was accepted")
	}
}

func TestParseEnvelopeRejects(t *testing.T) {
	long := b64.EncodeToString(bytes.Repeat([]byte("k"), maxKeyIDLen+1))
	ok := b64.EncodeToString([]byte("key"))
	sealed := b64.EncodeToString(make([]byte, gcmNonceSize+gcmTagSize))
	for name, s := range map[string]string{
		"empty":            "",
		"other cipher":     "local:v1:abcd",
		"vault":            "vault:v1:abcd",
		"future version":   "kms:v2:" + ok + "." + ok + "." + sealed,
		"two parts":        prefix + ok + "." + sealed,
		"four parts":       prefix + ok + "." + ok + "." + ok + "." + sealed,
		"padding":          prefix + ok + "=." + ok + "." + sealed,
		"standard base64":  prefix + ok + "." + ok + "+/." + sealed,
		"empty key id":     prefix + "." + ok + "." + sealed,
		"key id too long":  prefix + long + "." + ok + "." + sealed,
		"wrapped too long": prefix + ok + "." + b64.EncodeToString(make([]byte, maxWrappedLen+1)) + "." + sealed,
		"too short":        prefix + ok + "." + ok + "." + b64.EncodeToString(make([]byte, gcmNonceSize+gcmTagSize-1)),
		"newline":          prefix + ok + "." + ok + "." + sealed + "\n",
	} {
		if env, err := parseEnvelope([]byte(s)); err == nil {
			t.Errorf("%s: parsed %+v; want an error", name, env)
		}
	}
}

// FuzzParseEnvelope checks that no stored bytes crash the parser, and that
// whatever it accepts has the shape it promises.
func FuzzParseEnvelope(f *testing.F) {
	key, header := testAEADAndHeader(f)
	aead, _ := newAEAD(key())
	good, _ := seal(aead, header, []byte("seed"), []byte("record"))
	for _, s := range [][]byte{good, []byte(prefix), []byte(prefix + ".."), []byte("kms:v1:a.b.c"), nil} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := parseEnvelope(data)
		if err != nil {
			return
		}
		if len(env.keyID) == 0 || len(env.wrapped) == 0 || len(env.sealed) < gcmNonceSize+gcmTagSize ||
			!strings.HasPrefix(string(data), env.header) || !strings.HasPrefix(env.header, prefix) {
			t.Fatalf("accepted %q as %+v", data, env)
		}
		if _, err := env.open(aead, []byte("record")); err != nil && !errors.Is(err, errWrongContext) {
			t.Fatalf("open failed oddly: %v", err)
		}
	})
}
