package websession

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

func setClock(t *testing.T, start time.Time) *time.Time {
	t.Helper()
	clock := start
	old := now
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = old })
	return &clock
}

func fileStorage(t *testing.T) (*certmagic.FileStorage, string) {
	dir := t.TempDir()
	return &certmagic.FileStorage{Path: dir}, dir
}

// storedFiles returns every file under dir: what storage holds.
func storedFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			rel, _ := filepath.Rel(dir, p)
			out[filepath.ToSlash(rel)] = b
		}
		return err
	})
	return out
}

func TestSessionLifecycle(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	storage, dir := fileStorage(t)
	st := NewStore(storage, 0, nil, nil)
	s, err := st.Create(ctx, "alice@example.com", []string{"eng"}, "oidc", "", 30*time.Minute, 8*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.ID) < 40 {
		t.Fatalf("session id %q is short", s.ID)
	}
	for name, data := range storedFiles(t, dir) {
		if strings.Contains(name, s.ID) || bytes.Contains(data, []byte(s.ID)) || bytes.Contains(data, []byte(s.CSRF())) {
			t.Errorf("storage reveals the session id or its CSRF token: %s = %s", name, data)
		}
	}
	got, err := st.Get(ctx, s.ID)
	if err != nil || got.User != "alice@example.com" || got.Groups[0] != "eng" || got.Method != "oidc" {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if got.CSRF() != s.CSRF() || !got.CheckCSRF(s.CSRF()) || got.CheckCSRF("") || got.CheckCSRF(s.CSRF()+"x") {
		t.Error("the CSRF token is not stable per session or checks wrongly")
	}
	other, _ := st.Create(ctx, "alice@example.com", nil, "oidc", "", time.Hour, time.Hour)
	if other.CSRF() == s.CSRF() || other.Ref() == s.Ref() {
		t.Error("two sessions share a CSRF token or a ref")
	}

	// Used within the idle time, it lives on; unused, it ends.
	for range 4 {
		*clock = clock.Add(20 * time.Minute)
		if _, err := st.Get(ctx, s.ID); err != nil {
			t.Fatalf("used every 20 minutes, idle 30: %v", err)
		}
	}
	*clock = clock.Add(31 * time.Minute)
	if _, err := st.Get(ctx, s.ID); !errors.Is(err, ErrNotSignedIn) {
		t.Fatalf("after 31 idle minutes: %v", err)
	}

	// The absolute lifetime ends a session however much it is used.
	s, _ = st.Create(ctx, "bob", nil, "api_key", "", time.Hour, 2*time.Hour)
	for range 5 {
		*clock = clock.Add(25 * time.Minute)
		_, err = st.Get(ctx, s.ID)
	}
	if !errors.Is(err, ErrNotSignedIn) {
		t.Fatalf("after its lifetime: %v", err)
	}

	// Unknown and absurd ids.
	for _, id := range []string{"", "nope", strings.Repeat("x", 200)} {
		if _, err := st.Get(ctx, id); !errors.Is(err, ErrNotSignedIn) {
			t.Errorf("Get(%.10q) = %v", id, err)
		}
	}
}

func TestSignOutAndSignOutEverywhere(t *testing.T) {
	ctx := context.Background()
	setClock(t, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	storage, dir := fileStorage(t)
	st := NewStore(storage, 0, nil, nil)
	a1, _ := st.Create(ctx, "alice", nil, "oidc", "", time.Hour, time.Hour)
	a2, _ := st.Create(ctx, "alice", nil, "oidc", "", time.Hour, time.Hour)
	b1, _ := st.Create(ctx, "bob", nil, "oidc", "", time.Hour, time.Hour)
	if err := st.Delete(ctx, a1); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, a1.ID); !errors.Is(err, ErrNotSignedIn) {
		t.Fatalf("after sign-out: %v", err)
	}
	if _, err := st.Get(ctx, a2.ID); err != nil {
		t.Fatalf("signing out one browser ended another: %v", err)
	}
	a3, _ := st.Create(ctx, "alice", nil, "oidc", "", time.Hour, time.Hour)
	if n, err := st.DeleteAll(ctx, "alice"); err != nil || n != 2 {
		t.Fatalf("DeleteAll = %d, %v; want 2", n, err)
	}
	for _, s := range []*Session{a2, a3} {
		if _, err := st.Get(ctx, s.ID); !errors.Is(err, ErrNotSignedIn) {
			t.Errorf("after sign-out everywhere: %v", err)
		}
	}
	if _, err := st.Get(ctx, b1.ID); err != nil {
		t.Fatalf("alice signing out everywhere ended bob's session: %v", err)
	}
	if files := storedFiles(t, dir); len(files) != 2 {
		t.Errorf("storage holds %d files, want bob's record and index entry", len(files))
	}
}

func TestSessionsPerPersonAreBounded(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	storage, _ := fileStorage(t)
	st := NewStore(storage, 3, nil, nil)
	var made []*Session
	for range 5 {
		s, err := st.Create(ctx, "alice", nil, "oidc", "", time.Hour, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, s)
		*clock = clock.Add(time.Second)
	}
	for i, s := range made {
		_, err := st.Get(ctx, s.ID)
		if live := i >= 2; live != (err == nil) {
			t.Errorf("session %d: %v (the newest 3 live)", i, err)
		}
	}
}

func TestSweep(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	storage, dir := fileStorage(t)
	st := NewStore(storage, 0, nil, nil)
	_, _ = st.Create(ctx, "alice", nil, "oidc", "", time.Minute, time.Hour)
	keep, _ := st.Create(ctx, "bob", nil, "oidc", "", time.Hour, time.Hour)
	*clock = clock.Add(2 * time.Minute)
	if n, err := st.Sweep(ctx); n != 1 || err != nil {
		t.Fatalf("Sweep = %d, %v; want 1", n, err)
	}
	if files := storedFiles(t, dir); len(files) != 2 {
		t.Errorf("after the sweep storage holds %v", files)
	}
	if _, err := st.Get(ctx, keep.ID); err != nil {
		t.Fatal(err)
	}
}

func TestCookies(t *testing.T) {
	ctx := context.Background()
	setClock(t, time.Now())
	storage, _ := fileStorage(t)
	st := NewStore(storage, 0, nil, nil)
	s, _ := st.Create(ctx, "alice", nil, "oidc", "", time.Hour, time.Hour)
	for _, secure := range []bool{true, false} {
		w := httptest.NewRecorder()
		SetCookie(w, s, secure)
		c := w.Result().Cookies()[0]
		if !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || c.Secure != secure || c.Path != "/" || c.Domain != "" {
			t.Errorf("secure=%v: cookie %+v", secure, c)
		}
		if secure != strings.HasPrefix(c.Name, "__Host-") {
			t.Errorf("secure=%v: cookie name %s", secure, c.Name)
		}
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.AddCookie(c)
		if got, err := st.FromRequest(r, secure); err != nil || got.User != "alice" {
			t.Errorf("secure=%v: FromRequest = %v, %v", secure, got, err)
		}
		if _, err := st.FromRequest(r, !secure); !errors.Is(err, ErrNotSignedIn) {
			t.Errorf("secure=%v: the other cookie name signed in: %v", secure, err)
		}
	}
}

// hookedStorage runs beforeStore (once) before a value is stored under key.
type hookedStorage struct {
	certmagic.Storage
	key         string
	beforeStore func()
}

func (h *hookedStorage) Store(ctx context.Context, key string, value []byte) error {
	if key == h.key && h.beforeStore != nil {
		f := h.beforeStore
		h.beforeStore = nil
		f()
	}
	return h.Storage.Store(ctx, key, value)
}

// A page view that records the session's use while the person signs out
// everywhere (on another replica, say) writes the record back after it was
// deleted; the stolen cookie must not come back to life with it.
func TestSignOutWinsOverARecordedUse(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	files, _ := fileStorage(t)
	storage := &hookedStorage{Storage: files}
	st := NewStore(storage, 0, nil, nil)
	stolen, _ := st.Create(ctx, "alice", nil, "oidc", "", time.Hour, 8*time.Hour)
	*clock = clock.Add(2 * time.Minute) // the next use is written back
	storage.key = recordKey(stolen.ID)
	storage.beforeStore = func() {
		if n, err := st.DeleteAll(ctx, "alice"); n != 1 || err != nil {
			t.Errorf("DeleteAll = %d, %v", n, err)
		}
	}
	_, _ = st.Get(ctx, stolen.ID) // in flight when the sign-out happened
	if _, err := st.Get(ctx, stolen.ID); !errors.Is(err, ErrNotSignedIn) {
		t.Fatalf("the session signed out everywhere works again: %v", err)
	}
}

// blindExists is a storage whose Exists fails (says false), as a database
// storage's does when its query fails; everything else works.
type blindExists struct{ certmagic.Storage }

func (blindExists) Exists(context.Context, string) bool { return false }

// The sweep removes index entries whose session is gone, but neither one a
// storage merely failed to find, nor one whose session is being created:
// a session lives only while its index entry does.
func TestSweepKeepsTheIndexOfLiveSessions(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Now())
	files, _ := fileStorage(t)
	st := NewStore(blindExists{files}, 0, nil, nil)
	s, err := st.Create(ctx, "alice", nil, "oidc", "", time.Hour, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, s.ID); err != nil {
		t.Fatalf("after a sweep whose existence checks failed: %v", err)
	}
	// An index entry stored a moment ago, its record not yet: kept.
	if err := files.Store(ctx, indexKey("bob", hashOf("being created")), []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := NewStore(files, 0, nil, nil).Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if !files.Exists(ctx, indexKey("bob", hashOf("being created"))) {
		t.Fatal("the sweep removed the index entry of a session being created")
	}
	// Minutes later, with still no record, it is an orphan.
	*clock = clock.Add(2 * time.Minute)
	if _, err := NewStore(files, 0, nil, nil).Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if files.Exists(ctx, indexKey("bob", hashOf("being created"))) {
		t.Fatal("the sweep kept an index entry without a session")
	}
	if _, err := st.Get(ctx, s.ID); err != nil {
		t.Fatalf("alice's session after the sweeps: %v", err)
	}
}
