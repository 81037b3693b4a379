package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The adversarial suite: hostile runners, hostile or broken upstreams,
// failing peers, and too many connections. Every case asserts the clear
// answer the runner gets and that nothing reached the upstream or changed
// in storage that should not have. The cases are grouped by class, one
// file each (adversarial_*_test.go); cases that other tests already cover
// name them instead of repeating them.

// untouched is what a refused request must leave as it was: the requests
// the upstream received and the gateway's storage.
type untouched struct {
	up       *upstream
	dataDir  string
	requests int
	files    map[string]string
}

// snapshot records the upstream's requests so far and the storage's
// contents.
func snapshot(t testing.TB, up *upstream, g *gateway) untouched {
	t.Helper()
	return untouched{up: up, dataDir: g.DataDir, requests: len(up.requestLog()), files: storageFiles(t, g.DataDir)}
}

// check fails the test if the upstream received a request or the storage
// changed since the snapshot.
func (u untouched) check(t testing.TB) {
	t.Helper()
	if log := u.up.requestLog(); len(log) != u.requests {
		for _, r := range log[u.requests:] {
			t.Errorf("reached the upstream: %s %.200s", r.Method, r.Body)
		}
	}
	u.checkStorage(t)
}

// checkStorage fails the test if the storage changed since the snapshot.
func (u untouched) checkStorage(t testing.TB) {
	t.Helper()
	after := storageFiles(t, u.dataDir)
	for name, sum := range after {
		if before, ok := u.files[name]; !ok {
			t.Errorf("storage gained %s", name)
		} else if before != sum {
			t.Errorf("storage changed %s", name)
		}
	}
	for name := range u.files {
		if _, ok := after[name]; !ok {
			t.Errorf("storage lost %s", name)
		}
	}
}

// storageFiles maps each file under the gateway's file_system storage to
// the SHA-256 of its contents. The Activity page's record of decisions
// (written in batches, off the call path) and lock files are left out:
// they change with every decision the policy makes; so are tool pins,
// which record the upstream's tools when toolgate first lists them, not
// anything a runner sent.
func storageFiles(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if strings.HasPrefix(rel, "toolgate/activity/") || strings.HasPrefix(rel, "locks/") || strings.HasPrefix(rel, "toolgate/tool-pins/") {
			return nil
		}
		b, err := os.ReadFile(p)
		if os.IsNotExist(err) {
			return nil // removed while walking
		}
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		out[rel] = hex.EncodeToString(sum[:])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// rawRequest is one HTTP request to the MCP endpoint of m's session, with
// every header the test names (an empty value removes it) and the body as
// given (a reader without a length is sent chunked).
func (m *rawMCP) rawRequest(method string, header map[string]string, body io.Reader) (int, http.Header, string) {
	m.t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, m.url, body)
	if err != nil {
		m.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range m.headers {
		req.Header.Set(k, v)
	}
	if m.sessionID != "" {
		req.Header.Set("Mcp-Session-Id", m.sessionID)
	}
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		m.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, resp.Header, string(data)
}
