package integration

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Storage that is full or read-only: writes fail with a clear, retryable
// error and leave nothing half-written; everything that only reads (calls
// in existing sessions with stored credentials) goes on; and the gateway
// recovers by itself when the storage does. The storage is a real file
// system: a small tmpfs, filled up or remounted read-only. PostgreSQL
// going away: modules/storage/postgres (TestFaults).

// mountTmpfs mounts a tmpfs of size bytes at a new directory and returns
// it. Mounting needs root (CAP_SYS_ADMIN); without it the test is skipped.
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Skipf("cannot mount a tmpfs (needs root): %v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a file into dir until the file system is full, and returns
// a function that removes it.
func fill(t *testing.T, dir string) (free func()) {
	t.Helper()
	name := filepath.Join(dir, "filler")
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{'x'}, 4096)
	for i := 0; ; i++ {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
		if i > 1<<16 {
			t.Fatal("the file system does not fill up")
		}
	}
	f.Close()
	return func() {
		if err := os.Remove(name); err != nil {
			t.Fatal(err)
		}
	}
}

func remount(t *testing.T, dir, mode string) {
	t.Helper()
	if out, err := exec.Command("mount", "-o", "remount,"+mode, dir).CombinedOutput(); err != nil {
		t.Fatalf("remount %s %s: %v %s", mode, dir, err, out)
	}
}

func TestAdversarialStorage(t *testing.T) {
	dir := mountTmpfs(t, 1<<20)
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, DataDir: dir, Services: `service personal {
			url ` + up.URL + `
			allow_http
			tools echo
			auth bearer
		}`})
	sess := g.createSession(t, aliceKey, "svc", "personal")
	if r := g.api(t, http.MethodPut, "/v1/connections/personal", aliceKey, []byte(`{"token":"first-token"}`)); r.StatusCode/100 != 2 {
		t.Fatalf("PUT token: %d %s", r.StatusCode, r.Body)
	}
	svc := g.raw(t, aliceKey, sess, "svc")
	svc.initialize()
	personal := g.raw(t, aliceKey, sess, "personal")
	personal.initialize()
	echo := func(m *rawMCP, text string) string {
		_, _, msgs := m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"` + text + `"}}}`)
		return string(lastMessage(t, msgs))
	}
	// Before any fault, a call of each service: toolgate pins the tools
	// it sees first (a write, which a broken storage refuses).
	for _, m := range []*rawMCP{svc, personal} {
		if got := echo(m, "warm"); !strings.Contains(got, `\"text\":\"warm\"`) {
			t.Fatalf("a call before the faults: %s", got)
		}
	}
	token := "first-token" // the one stored
	lastToken := func() string {
		log := up.requestLog()
		return log[len(log)-1].Header.Get("Authorization")
	}

	faults := []struct {
		name   string
		break_ func() (repair func())
	}{
		{"full", func() func() { return fill(t, dir) }},
		{"read-only", func() func() {
			remount(t, dir, "ro")
			return func() { remount(t, dir, "rw") }
		}},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			before := storageFiles(t, dir)
			repair := f.break_()
			repaired := false
			defer func() {
				if !repaired {
					repair()
				}
			}()
			// Writes are refused, clearly.
			type write struct {
				what   string
				method string
				path   string
				body   string
			}
			writes := []write{
				{"a new session", http.MethodPost, "/v1/sessions", `{"services":["svc"]}`},
				{"a new token", http.MethodPut, "/v1/connections/personal", `{"token":"second-token"}`},
			}
			if f.name == "read-only" { // a full file system still deletes
				writes = append(writes,
					write{"ending a session", http.MethodDelete, "/v1/sessions/" + sess, ""},
					write{"forgetting a token", http.MethodDelete, "/v1/connections/personal", ""})
			}
			for _, w := range writes {
				var body []byte
				if w.body != "" {
					body = []byte(w.body)
				}
				r := g.api(t, w.method, w.path, aliceKey, body)
				if r.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(r.Body), "could not be") {
					t.Errorf("%s: %d %s; want 503 saying what could not be done", w.what, r.StatusCode, r.Body)
				}
				if strings.Contains(string(r.Body), dir) {
					t.Errorf("%s: the answer names the storage's path: %s", w.what, r.Body)
				}
			}
			// Nothing is half-written: every record is as it was.
			after := storageFiles(t, dir)
			delete(after, "filler")
			for name, sum := range after {
				if before[name] != sum {
					t.Errorf("storage changed %s", name)
				}
			}
			for name := range before {
				if _, ok := after[name]; !ok {
					t.Errorf("storage lost %s", name)
				}
			}
			// Reading goes on: calls in the session, with the stored token.
			if got := echo(svc, "still"); !strings.Contains(got, `\"text\":\"still\"`) {
				t.Errorf("a call while the storage is %s: %s", f.name, got)
			}
			if got := echo(personal, "token"); !strings.Contains(got, `\"text\":\"token\"`) || lastToken() != "Bearer "+token {
				t.Errorf("a call with the stored token while the storage is %s: %s, %q", f.name, got, lastToken())
			}
			// Repaired, the same writes work without a restart.
			repair()
			repaired = true
			if r := g.api(t, http.MethodPut, "/v1/connections/personal", aliceKey, []byte(`{"token":"`+f.name+`-token"}`)); r.StatusCode/100 != 2 {
				t.Errorf("PUT token after repair: %d %s", r.StatusCode, r.Body)
			}
			token = f.name + "-token"
			// The new token is a new connection: the MCP session of the
			// old one is over, and the runner initializes a new one
			// (while the storage can record it).
			personal.sessionID = ""
			personal.initialize()
			if got := echo(personal, "renewed"); !strings.Contains(got, `\"text\":\"renewed\"`) || lastToken() != "Bearer "+token {
				t.Errorf("a call with the new token after repair: %s, %q", got, lastToken())
			}
			if r := g.api(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(`{"services":["svc"]}`)); r.StatusCode != http.StatusCreated {
				t.Errorf("a new session after repair: %d %s", r.StatusCode, r.Body)
			}
		})
	}
}
