package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// backends are the storages every conformance case runs against: Caddy's
// default file_system storage (certmagic.FileStorage), whose semantics are
// the reference, and this module.
var backends = []struct {
	name string
	new  func(t *testing.T) certmagic.Storage
}{
	{"file_system", func(t *testing.T) certmagic.Storage { return &certmagic.FileStorage{Path: t.TempDir()} }},
	{"postgres", func(t *testing.T) certmagic.Storage {
		return newStorage(t, sharedDSN(t, "conformance"), newTableName(), DefaultLockLease)
	}},
}

// conformance is one table of storage behaviours, each run on a fresh,
// empty storage of every backend.
var conformance = []struct {
	name string
	run  func(t *testing.T, ctx context.Context, s certmagic.Storage)
}{
	{"store and load", func(t *testing.T, ctx context.Context, s certmagic.Storage) {
		binary := make([]byte, 256)
		for i := range binary {
			binary[i] = byte(i)
		}
		big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
		for _, v := range [][]byte{[]byte("one"), {}, binary, big, []byte("two")} {
			mustStore(t, ctx, s, "k", v)
			if got := mustLoad(t, ctx, s, "k"); !bytes.Equal(got, v) {
				t.Fatalf("Load after storing %d bytes: got %d bytes", len(v), len(got))
			}
		}
		mustStore(t, ctx, s, "x//y/", []byte("clean"))
		if got := mustLoad(t, ctx, s, "x/y"); string(got) != "clean" {
			t.Fatalf(`Load("x/y") after Store("x//y/") = %q`, got)
		}
	}},
	{"missing keys", func(t *testing.T, ctx context.Context, s certmagic.Storage) {
		mustStore(t, ctx, s, "a/b", []byte("v"))
		// (not keys below the value a/b: on a file system they fail with
		// ENOTDIR and "exist"; see TestBelowValue)
		for _, k := range []string{"nope", "a/nope", "a/bb", "a/b-"} {
			if _, err := s.Load(ctx, k); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("Load(%q) = %v, want fs.ErrNotExist", k, err)
			}
			if _, err := s.Stat(ctx, k); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("Stat(%q) = %v, want fs.ErrNotExist", k, err)
			}
			if s.Exists(ctx, k) {
				t.Errorf("Exists(%q) = true", k)
			}
			if err := s.Delete(ctx, k); err != nil {
				t.Errorf("Delete(%q) = %v, want nil", k, err)
			}
		}
		for _, k := range []string{"nope", "a/nope"} {
			if _, err := s.List(ctx, k, false); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("List(%q) = %v, want fs.ErrNotExist", k, err)
			}
		}
		if _, err := s.Load(ctx, "a"); err == nil || errors.Is(err, fs.ErrNotExist) {
			t.Errorf(`Load of the directory "a" = %v, want an error other than fs.ErrNotExist`, err)
		}
	}},
	{"directories", func(t *testing.T, ctx context.Context, s certmagic.Storage) {
		tree(t, ctx, s)
		for k, want := range map[string]bool{"a": true, "a/b": true, "a/b/c": true, "f": true, "a/x": false, "a/b/cc": false, "b": false} {
			if got := s.Exists(ctx, k); got != want {
				t.Errorf("Exists(%q) = %v, want %v", k, got, want)
			}
		}
		for k, terminal := range map[string]bool{"a": false, "a/b": false, "a/b/c": true, "f": true} {
			info, err := s.Stat(ctx, k)
			if err != nil {
				t.Fatalf("Stat(%q): %v", k, err)
			}
			if info.Key != k || info.IsTerminal != terminal {
				t.Errorf("Stat(%q) = key %q terminal %v, want terminal %v", k, info.Key, info.IsTerminal, terminal)
			}
		}
	}},
	{"list", func(t *testing.T, ctx context.Context, s certmagic.Storage) {
		tree(t, ctx, s)
		for _, c := range []struct {
			prefix    string
			recursive bool
			want      []string
		}{
			{"a", false, []string{"a/b", "a/e"}},
			{"a", true, []string{"a/b", "a/b/c", "a/b/d", "a/e"}},
			{"a/b", false, []string{"a/b/c", "a/b/d"}},
			{"a/b/", true, []string{"a/b/c", "a/b/d"}},
			{"a/b/c", false, nil},
			{"o", false, []string{"o/b", "o/b-c", "o/b.c", "o/ba"}},
			{"o", true, []string{"o/b", "o/b/x", "o/b-c", "o/b.c", "o/ba"}},
			{"", false, []string{"a", "f", "o"}},
			{"", true, []string{"a", "a/b", "a/b/c", "a/b/d", "a/e", "f", "o", "o/b", "o/b/x", "o/b-c", "o/b.c", "o/ba"}},
		} {
			got, err := s.List(ctx, c.prefix, c.recursive)
			if err != nil {
				t.Fatalf("List(%q, %v): %v", c.prefix, c.recursive, err)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("List(%q, %v) = %q, want %q", c.prefix, c.recursive, got, c.want)
			}
		}
	}},
	{"delete", func(t *testing.T, ctx context.Context, s certmagic.Storage) {
		tree(t, ctx, s)
		mustDelete(t, ctx, s, "a/b")
		if s.Exists(ctx, "a/b") || s.Exists(ctx, "a/b/c") || !s.Exists(ctx, "a/e") {
			t.Fatal(`Delete("a/b") did not delete exactly the directory a/b`)
		}
		mustDelete(t, ctx, s, "f")
		mustDelete(t, ctx, s, "a")
		got, err := s.List(ctx, "", true)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"o", "o/b", "o/b/x", "o/b-c", "o/b.c", "o/ba"}; !slices.Equal(got, want) {
			t.Fatalf("after deleting a and f: %q, want %q", got, want)
		}
	}},
	{"stat", func(t *testing.T, ctx context.Context, s certmagic.Storage) {
		before := time.Now()
		mustStore(t, ctx, s, "d/k", []byte("12345"))
		after := time.Now()
		info, err := s.Stat(ctx, "d/k")
		if err != nil {
			t.Fatal(err)
		}
		if info.Size != 5 || !info.IsTerminal {
			t.Errorf("Stat = size %d terminal %v, want 5 true", info.Size, info.IsTerminal)
		}
		// the clocks of the file system and PostgreSQL are this machine's;
		// allow for their resolution
		if info.Modified.Before(before.Add(-time.Second)) || info.Modified.After(after.Add(time.Second)) {
			t.Errorf("Modified %v is not when the key was stored (%v to %v)", info.Modified, before, after)
		}
		mustStore(t, ctx, s, "d/k", []byte("1234567"))
		again, err := s.Stat(ctx, "d/k")
		if err != nil {
			t.Fatal(err)
		}
		if again.Size != 7 || again.Modified.Before(info.Modified) {
			t.Errorf("after storing again: size %d modified %v, want 7 and not before %v", again.Size, again.Modified, info.Modified)
		}
		dir, err := s.Stat(ctx, "d")
		if err != nil || dir.IsTerminal {
			t.Errorf(`Stat("d") = %+v, %v, want a directory`, dir, err)
		}
	}},
	{"values and directories exclude each other", func(t *testing.T, ctx context.Context, s certmagic.Storage) {
		mustStore(t, ctx, s, "v", []byte("value"))
		mustStore(t, ctx, s, "dir/k", []byte("inside"))
		if err := s.Store(ctx, "v/under", []byte("x")); err == nil {
			t.Error(`Store("v/under") succeeded below the value "v"`)
		}
		if err := s.Store(ctx, "dir", []byte("x")); err == nil {
			t.Error(`Store("dir") succeeded over a directory`)
		}
		if got := mustLoad(t, ctx, s, "v"); string(got) != "value" {
			t.Errorf("v = %q after the refused store", got)
		}
		if got := mustLoad(t, ctx, s, "dir/k"); string(got) != "inside" {
			t.Errorf("dir/k = %q after the refused store", got)
		}
		got, err := s.List(ctx, "", true)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"dir", "dir/k", "v"}; !slices.Equal(got, want) {
			t.Errorf("keys after refused stores: %q, want %q", got, want)
		}
	}},
	{"odd characters", func(t *testing.T, ctx context.Context, s certmagic.Storage) {
		odd := []string{
			"sp ace/tab\there", "quote's/\"double\"", `back\slash`, "üñï/日本語/🔑",
			"per%cent/x", "under_score/y", "under-score/z", "star*/q?/[b]/{c}", "new\nline",
			"semi;colon,amp&eq=plus+hash#tilde~", "dot.s/..name../...",
		}
		for i, k := range odd {
			mustStore(t, ctx, s, k, []byte(fmt.Sprint(i)))
		}
		for i, k := range odd {
			if got := mustLoad(t, ctx, s, k); string(got) != fmt.Sprint(i) {
				t.Errorf("Load(%q) = %q, want %d", k, got, i)
			}
		}
		// LIKE wildcards in a prefix must match only themselves
		for _, k := range []string{"p%/x", "pp/x", "p_/y", "pq/y"} {
			mustStore(t, ctx, s, k, []byte("v"))
		}
		for prefix, want := range map[string][]string{"p%": {"p%/x"}, "p_": {"p_/y"}} {
			got, err := s.List(ctx, prefix, true)
			if err != nil || !slices.Equal(got, want) {
				t.Errorf("List(%q) = %q, %v, want %q", prefix, got, err, want)
			}
		}
		mustDelete(t, ctx, s, "p_")
		mustDelete(t, ctx, s, "p%")
		for _, k := range []string{"pp/x", "pq/y"} {
			if !s.Exists(ctx, k) {
				t.Errorf("deleting p_ and p%% deleted %q", k)
			}
		}
		got, err := s.List(ctx, "under_score", false)
		if err != nil || !slices.Equal(got, []string{"under_score/y"}) {
			t.Errorf(`List("under_score") = %q, %v`, got, err)
		}
	}},
	{"concurrent stores", func(t *testing.T, ctx context.Context, s certmagic.Storage) {
		var wg sync.WaitGroup
		errs := make(chan error, 40)
		for i := range 40 {
			wg.Go(func() {
				errs <- s.Store(ctx, fmt.Sprintf("c/%02d", i), []byte{byte(i)})
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.List(ctx, "c", false)
		if err != nil || len(got) != 40 {
			t.Fatalf("List after 40 concurrent stores: %d keys, %v", len(got), err)
		}
	}},
}

func TestConformance(t *testing.T) {
	for _, c := range conformance {
		t.Run(c.name, func(t *testing.T) {
			for _, b := range backends {
				t.Run(b.name, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					c.run(t, ctx, b.new(t))
				})
			}
		})
	}
}

// tree stores a/b/c, a/b/d, a/e, f, and o/b/x, o/b-c, o/b.c, o/ba (whose
// names sort differently bytewise than in a directory walk).
func tree(t *testing.T, ctx context.Context, s certmagic.Storage) {
	t.Helper()
	for _, k := range []string{"a/b/c", "a/b/d", "a/e", "f", "o/ba", "o/b.c", "o/b-c", "o/b/x"} {
		mustStore(t, ctx, s, k, []byte(k))
	}
}

func mustStore(t *testing.T, ctx context.Context, s certmagic.Storage, k string, v []byte) {
	t.Helper()
	if err := s.Store(ctx, k, v); err != nil {
		t.Fatalf("Store(%q): %v", k, err)
	}
}

func mustLoad(t *testing.T, ctx context.Context, s certmagic.Storage, k string) []byte {
	t.Helper()
	v, err := s.Load(ctx, k)
	if err != nil {
		t.Fatalf("Load(%q): %v", k, err)
	}
	return v
}

func mustDelete(t *testing.T, ctx context.Context, s certmagic.Storage, k string) {
	t.Helper()
	if err := s.Delete(ctx, k); err != nil {
		t.Fatalf("Delete(%q): %v", k, err)
	}
}

// TestBelowValue: a key below a value does not exist. (FileStorage gets
// ENOTDIR from the file system there, which Exists takes for existence;
// this module answers as for any missing key.)
func TestBelowValue(t *testing.T) {
	s := newStorage(t, sharedDSN(t, "conformance"), newTableName(), DefaultLockLease)
	ctx := t.Context()
	mustStore(t, ctx, s, "a/b", []byte("v"))
	if _, err := s.Load(ctx, "a/b/c"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load = %v", err)
	}
	if _, err := s.Stat(ctx, "a/b/c"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat = %v", err)
	}
	if _, err := s.List(ctx, "a/b/c", true); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("List = %v", err)
	}
	if s.Exists(ctx, "a/b/c") {
		t.Error("Exists = true")
	}
	if err := s.Delete(ctx, "a/b/c"); err != nil {
		t.Errorf("Delete = %v", err)
	}
	if got := mustLoad(t, ctx, s, "a/b"); string(got) != "v" {
		t.Errorf("a/b = %q", got)
	}
}
