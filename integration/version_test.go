package integration

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The binary speaks of itself as toolgate: its version is toolgate's, with
// the Caddy it is built on after it, and its help names toolgate's
// commands.
func TestBinaryNamesItselfToolgate(t *testing.T) {
	bin := toolgateBinary(t)
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("toolgate version: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`^toolgate \S+, Caddy v2\.`).Match(out) {
		t.Errorf("toolgate version printed %q: want toolgate's version, then Caddy's", out)
	}
	out, err = exec.Command(bin, "help").CombinedOutput()
	if err != nil {
		t.Fatalf("toolgate help: %v\n%s", err, out)
	}
	for _, want := range []string{"toolgate is an MCP gateway", "toolgate run --config", "Usage:\n  toolgate [command]"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("toolgate help lacks %q:\n%s", want, out)
		}
	}
	// Caddy's upgrade would download a plain Caddy in its place (and, in
	// a binary not built by Caddy's tools, panicked).
	cmd := exec.Command(bin, "upgrade")
	out, err = cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "build a new binary") || strings.Contains(string(out), "panic") {
		t.Errorf("toolgate upgrade: %v\n%s", err, out)
	}
}

// toolgate reload applies a changed file the configuration names even when
// the Caddyfile is unchanged: an API key removed from the api_keys file
// stops working. (Caddy alone answers "config is unchanged" and keeps the
// old keys.)
func TestReloadAppliesChangedFilesOfAnUnchangedCaddyfile(t *testing.T) {
	bin := toolgateBinary(t)
	dir := t.TempDir()
	keys := filepath.Join(dir, "api_keys.json")
	writeKeys := func(text string) {
		if err := os.WriteFile(keys, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeKeys(`[{"hash":"` + hashKey(aliceKey) + `","user":"alice@example.com"}]`)
	port, admin := freePort(t), freePort(t)
	p := startProcess(t, bin, "toolgate", fmt.Sprintf(`{
	admin 127.0.0.1:%[1]d
	auto_https off
	persist_config off
	storage file_system %[2]s/caddy
	toolgate {
		public_url http://127.0.0.1:%[3]d
		storage file_system %[2]s/data
		auth {
			api_keys %[4]s
		}
	}
}

http://127.0.0.1:%[3]d {
	toolgate_api
}
`, admin, dir, port, keys), nil, func() bool {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	catalog := func() int {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/v1/catalog", port), nil)
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := catalog(); s != http.StatusOK {
		t.Fatalf("premise: alice's key answers %d before the reload", s)
	}
	writeKeys(`[]`)
	out, err := exec.Command(bin, "reload", "--config", p.cmd.Args[3], "--address", fmt.Sprintf("127.0.0.1:%d", admin)).CombinedOutput()
	if err != nil {
		t.Fatalf("toolgate reload: %v\n%s", err, out)
	}
	if s := catalog(); s != http.StatusUnauthorized {
		t.Errorf("alice's key, removed from the api_keys file, answers %d after toolgate reload: want 401", s)
	}
}
