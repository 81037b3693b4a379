package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"sync"
	"testing"
	"time"
)

// A replica is the real toolgate binary running as its own process, so that
// several of them can share one storage directory as gateway replicas do.

// buildToolgate builds ./cmd/toolgate into dir, with the race detector when
// this test binary has it (so the build reuses the packages `go test`
// compiled).
func buildToolgate(t testing.TB, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "toolgate")
	args := []string{"build", "-o", bin}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "-race" && s.Value == "true" {
				args = append(args, "-race")
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", append(args, "github.com/toolgate/toolgate/cmd/toolgate")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/toolgate: %v\n%s", err, out)
	}
	return bin
}

// replica is one running toolgate process.
type replica struct {
	*gateway
	out *lockedBuffer
}

// startReplica runs bin with a Caddyfile whose toolgate block holds
// toolgateBlock (everything but public_url), on a free loopback port, and
// stops it when t ends.
func startReplica(t testing.TB, bin, toolgateBlock, dataDir string) *replica {
	t.Helper()
	return startReplicaWith(t, bin, toolgateBlock, dataDir, testdataPath(t, "policy"))
}

// startReplicaWith is startReplica with the policies of policyDir.
func startReplicaWith(t testing.TB, bin, toolgateBlock, dataDir, policyDir string) *replica {
	t.Helper()
	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	caddyfile := fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	storage file_system %[3]s/caddy
	log {
		level WARN
	}
	toolgate {
		public_url %[1]s
		%[2]s
	}
}

%[1]s {
	route /v1/mcp/* {
		toolgate_session
		toolgate_registry
		toolgate_policy {
			source %[4]s
			timeout 30s
		}
		toolgate_credentials
		toolgate_result_policy {
			source %[4]s
			timeout 30s
		}
		toolgate_proxy
	}
	toolgate_api
	toolgate_console {
		api_key_login
	}
}
`, base, toolgateBlock, dataDir, policyDir)
	cfgFile := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(cfgFile, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &replica{gateway: &gateway{URL: base, DataDir: dataDir}, out: new(lockedBuffer)}
	cmd := exec.Command(bin, "run", "--config", cfgFile, "--adapter", "caddyfile")
	cmd.Stdout, cmd.Stderr = r.out, r.out
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "XDG_DATA_HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Errorf("toolgate (pid %d) did not exit", cmd.Process.Pid)
		}
		if t.Failed() {
			t.Logf("toolgate at %s printed (tail):\n%s", base, r.out.tail(16<<10))
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if status, err := httpStatus(base + "/.well-known/oauth-protected-resource"); err == nil && status == http.StatusOK {
			return r
		}
		select {
		case <-exited:
			t.Fatalf("toolgate exited before it served:\n%s", r.out.tail(16<<10))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("toolgate at %s did not start within 30s:\n%s", base, r.out.tail(16<<10))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestOAuthRefreshStampedeAcrossTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := buildToolgate(t, t.TempDir())
	// The first access token lives three seconds (the runners initialize
	// on both replicas meanwhile); the refreshed one an hour.
	p := startOAuthProvider(t, providerConfig{AccessTTL: 3 * time.Second, RefreshedAccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	data := t.TempDir()
	block := fmt.Sprintf(`state_secret %s
		storage file_system %s
		cipher local %s/cipher.key
		auth {
			api_key %s %s
		}
		service svc {
			url %s
			allow_http
			tools echo
			auth %s
		}`, testStateSecret, data, data, hashKey(aliceKey), alice, up.URL, oauthBlock(p, ""))

	// One after the other: the first creates the shared cipher key.
	a := startReplica(t, bin, block, data)
	b := startReplica(t, bin, block, data)
	p.allowRedirect(a.URL + "/v1/connections/svc/callback")

	a.connectOAuth(t, aliceKey)
	connectedAt := time.Now()
	sess := a.createSession(t, aliceKey, "svc") // sessions live in the shared storage
	ma := a.raw(t, aliceKey, sess, "svc")
	mb := b.raw(t, aliceKey, sess, "svc")
	ma.initialize()
	mb.initialize()
	if len(p.refreshes()) != 0 {
		t.Fatal("a refresh happened before the token expired")
	}
	time.Sleep(time.Until(connectedAt.Add(3*time.Second + 150*time.Millisecond)))

	errs := concurrentEchoes(50, ma, mb)
	for _, err := range errs {
		t.Error(err)
	}
	if n := len(p.refreshes()); n != 1 {
		t.Fatalf("50 concurrent calls through two replicas made %d refreshes at the provider, want exactly 1", n)
	}
	p.checkRotation(t)
	if _, refused := up.seen(); refused != 0 {
		t.Errorf("the upstream refused %d requests", refused)
	}
	for _, g := range []*replica{a, b} {
		if s := g.catalogService(t, aliceKey, "svc"); s.Connection == nil || s.Connection.RefreshCount != 1 {
			t.Errorf("catalog at %s: %+v, want refresh_count 1", g.URL, s)
		}
	}
}

func httpStatus(u string) (int, error) {
	client := http.Client{Timeout: time.Second}
	resp, err := client.Get(u)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// lockedBuffer collects a process's output.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// tail returns the last n bytes written.
func (b *lockedBuffer) tail(n int) string {
	s := b.String()
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}
