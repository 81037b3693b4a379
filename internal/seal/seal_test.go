package seal

import (
	"bytes"
	"errors"
	"testing"
)

func TestSealOpensWithEveryKeyOfTheRing(t *testing.T) {
	old, _ := New("p", []byte("old secret"))
	rotated, err := New("p", []byte("new secret"), []byte("old secret"))
	if err != nil {
		t.Fatal(err)
	}
	ad := []byte("bound to this")
	sealedOld := old.Seal([]byte("hello"), ad)
	sealedNew := rotated.Seal([]byte("hello"), ad)
	if len(sealedNew) != len("hello")+Overhead {
		t.Errorf("sealed %d bytes into %d, want %d more", len("hello"), len(sealedNew), Overhead)
	}
	for name, c := range map[string]struct {
		ring   *Keyring
		sealed []byte
		opens  bool
	}{
		"old value, rotated ring": {rotated, sealedOld, true},
		"new value, rotated ring": {rotated, sealedNew, true},
		"new value, old ring":     {old, sealedNew, false},
	} {
		plain, err := c.ring.Open(c.sealed, ad)
		switch {
		case c.opens && (err != nil || string(plain) != "hello"):
			t.Errorf("%s: %q, %v", name, plain, err)
		case !c.opens && !errors.Is(err, ErrUnsealable):
			t.Errorf("%s: opened (%q, %v)", name, plain, err)
		}
	}
	// The rotated ring seals with its first (new) secret only.
	newOnly, _ := New("p", []byte("new secret"))
	if _, err := newOnly.Open(sealedNew, ad); err != nil {
		t.Errorf("a value sealed by the rotated ring needs the old secret: %v", err)
	}
}

func TestSealRefusesWhatItDidNotSeal(t *testing.T) {
	r, _ := New("mcp", []byte("secret"))
	ad := []byte("ad")
	sealed := r.Seal([]byte("value"), ad)
	otherPurpose, _ := New("other", []byte("secret"))
	otherSecret, _ := New("mcp", []byte("another secret"))
	flipped := bytes.Clone(sealed)
	flipped[len(flipped)-1] ^= 1
	badID := bytes.Clone(sealed)
	badID[0] ^= 1
	for name, c := range map[string]struct {
		ring   *Keyring
		sealed []byte
		ad     []byte
	}{
		"another purpose":     {otherPurpose, sealed, ad},
		"another secret":      {otherSecret, sealed, ad},
		"other ad":            {r, sealed, []byte("da")},
		"a flipped bit":       {r, flipped, ad},
		"an unknown key id":   {r, badID, ad},
		"truncated":           {r, sealed[:Overhead-1], ad},
		"nothing":             {r, nil, ad},
		"random process ring": {Random("mcp"), sealed, ad},
	} {
		if plain, err := c.ring.Open(c.sealed, c.ad); !errors.Is(err, ErrUnsealable) {
			t.Errorf("%s: opened (%q, %v)", name, plain, err)
		}
	}
	if _, err := New("p"); err == nil {
		t.Error("a ring without secrets")
	}
	if _, err := New("p", []byte("x"), nil); err == nil {
		t.Error("a ring with an empty secret")
	}
}

func TestWithSealsWithTheFirstAndOpensWithBoth(t *testing.T) {
	configured, _ := New("p", []byte("configured"))
	process := Random("p")
	both := configured.With(process)
	fromProcess := process.Seal([]byte("a"), nil)
	if _, err := both.Open(fromProcess, nil); err != nil {
		t.Errorf("a value of the process key: %v", err)
	}
	if _, err := configured.Open(both.Seal([]byte("b"), nil), nil); err != nil {
		t.Errorf("the combined ring does not seal with the configured key: %v", err)
	}
	if (*Keyring)(nil).With(process) != process || process.With(nil) != process {
		t.Error("With of nil")
	}
}

func BenchmarkSealOpen(b *testing.B) {
	r, _ := New("p", []byte("secret"))
	plain := make([]byte, 64)
	for b.Loop() {
		if _, err := r.Open(r.Seal(plain, nil), nil); err != nil {
			b.Fatal(err)
		}
	}
}
