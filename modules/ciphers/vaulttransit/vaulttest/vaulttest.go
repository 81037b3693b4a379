// Package vaulttest starts real HashiCorp Vault dev servers for tests.
//
// The Vault binary comes from the TOOLGATE_VAULT_BIN environment variable;
// build it once with
//
//	export TOOLGATE_VAULT_BIN=$(integration/vaultserver/build.sh)
//
// Without it, tests that need Vault are skipped, or fail when
// TOOLGATE_REQUIRE_PEERS=1 (as in CI).
package vaulttest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"

	"github.com/toolgate/toolgate/internal/testproc"
)

// Environment variables read by this package.
const (
	EnvVaultBin     = "TOOLGATE_VAULT_BIN"
	EnvRequirePeers = "TOOLGATE_REQUIRE_PEERS"
)

// startTimeout bounds how long a dev server may take to answer sys/health.
const startTimeout = 30 * time.Second

// Key is the name of the derived Transit key every server starts with.
const Key = "toolgate"

// Server is a running Vault dev server: in-memory storage, unsealed, with a
// Transit engine enabled at "transit" holding a derived key named [Key].
type Server struct {
	// Addr is the server's URL, http://127.0.0.1:<port>.
	Addr string
	// RootToken is the dev server's root token.
	RootToken string
	// Key is the derived Transit key created at start ([Key]). Tests that
	// share a server and rotate or reconfigure keys should make their own
	// with [Server.NewKey].
	Key string

	cmd      *exec.Cmd
	home     string
	out      *testproc.Output
	exited   chan struct{}
	stopOnce sync.Once
}

// Start starts a dev server for t alone and stops it when t ends. Use it for
// tests that seal or stop the server; others can share one with [Shared].
func Start(t testing.TB) *Server {
	t.Helper()
	bin := binary(t)
	s, err := start(bin)
	if err != nil {
		t.Fatalf("vaulttest: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("vault dev server output (tail):\n%s", s.outputTail())
		}
		s.Stop()
	})
	return s
}

var shared struct {
	once sync.Once
	s    *Server
	err  error
}

// Shared returns a dev server shared by every test of the test binary,
// starting it on first use. Tests sharing it must not seal or stop it, and
// should each create their own keys ([Server.NewKey]). Call [StopShared]
// from TestMain after m.Run.
func Shared(t testing.TB) *Server {
	t.Helper()
	bin := binary(t)
	shared.once.Do(func() { shared.s, shared.err = start(bin) })
	if shared.err != nil {
		t.Fatalf("vaulttest: %v", shared.err)
	}
	return shared.s
}

// StopShared stops the server started by [Shared], if any.
func StopShared() {
	if shared.s != nil {
		shared.s.Stop()
	}
}

// binary returns the Vault binary, or skips (or fails) t without one.
func binary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv(EnvVaultBin)
	if bin == "" {
		msg := "no Vault binary: run `export " + EnvVaultBin + "=$(integration/vaultserver/build.sh)` from the repository root"
		if os.Getenv(EnvRequirePeers) == "1" {
			t.Fatal(msg + " (" + EnvRequirePeers + "=1 makes this a failure)")
		}
		t.Skip(msg)
	}
	if st, err := os.Stat(bin); err != nil || st.IsDir() {
		t.Fatalf("%s=%s is not a file: rebuild it with integration/vaultserver/build.sh", EnvVaultBin, bin)
	}
	return bin
}

// start runs a dev server, retrying on a fresh port if the chosen one was
// taken meanwhile.
func start(bin string) (*Server, error) {
	var err error
	for range 3 {
		var s *Server
		s, err = startOnce(bin)
		if err == nil {
			return s, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, err
}

func startOnce(bin string) (*Server, error) {
	port, err := testproc.FreePort()
	if err != nil {
		return nil, err
	}
	home, err := os.MkdirTemp("", "vaulttest-home-")
	if err != nil {
		return nil, err
	}
	s := &Server{
		Addr:      "http://127.0.0.1:" + strconv.Itoa(port),
		RootToken: "root-" + randomHex(16),
		home:      home,
		out:       new(testproc.Output),
		exited:    make(chan struct{}),
	}
	s.cmd = exec.Command(bin, "server", "-dev",
		"-dev-root-token-id="+s.RootToken,
		"-dev-listen-address=127.0.0.1:"+strconv.Itoa(port),
		"-dev-no-store-token",
	)
	s.cmd.Env = serverEnv(home)
	s.cmd.Stdout = s.out
	s.cmd.Stderr = s.out
	setParentDeathSignal(s.cmd)
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(home)
		return nil, fmt.Errorf("starting %s: %v", bin, err)
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()
	if err := s.waitHealthy(); err != nil {
		s.Stop()
		return nil, fmt.Errorf("%v\nvault output (tail):\n%s", err, s.outputTail())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := s.Client()
	if err := client.Sys().MountWithContext(ctx, "transit", &api.MountInput{Type: "transit"}); err != nil {
		s.Stop()
		return nil, fmt.Errorf("enabling transit: %v", err)
	}
	if _, err := client.Logical().WriteWithContext(ctx, "transit/keys/"+Key, map[string]any{"derived": true}); err != nil {
		s.Stop()
		return nil, fmt.Errorf("creating transit key %q: %v", Key, err)
	}
	s.Key = Key
	return s, nil
}

// serverEnv is the environment without VAULT_* variables, with HOME pointing
// at a scratch directory so nothing touches the user's ~/.vault-token.
func serverEnv(home string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "VAULT_") || strings.HasPrefix(kv, "HOME=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "HOME="+home)
}

func (s *Server) waitHealthy() error {
	client := s.Client()
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return errors.New("vault dev server exited before it was ready")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		h, err := client.Sys().HealthWithContext(ctx)
		cancel()
		if err == nil && h.Initialized && !h.Sealed {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("vault dev server at %s did not become healthy within %s", s.Addr, startTimeout)
}

// Client returns a new API client for the server, authenticated with the
// root token.
func (s *Server) Client() *api.Client {
	c, err := api.NewClient(&api.Config{Address: s.Addr, MaxRetries: 0, Timeout: 10 * time.Second})
	if err != nil {
		panic(fmt.Sprintf("vaulttest: client for %s: %v", s.Addr, err))
	}
	c.ClearNamespace()
	c.SetToken(s.RootToken)
	return c
}

// CreateKey creates the Transit key name (derived or not) under "transit".
func (s *Server) CreateKey(t testing.TB, name string, derived bool) {
	t.Helper()
	_, err := s.Client().Logical().Write("transit/keys/"+name, map[string]any{"derived": derived})
	if err != nil {
		t.Fatalf("vaulttest: creating transit key %q: %v", name, err)
	}
}

// NewKey creates a derived Transit key with a fresh name and returns the
// name.
func (s *Server) NewKey(t testing.TB) string {
	t.Helper()
	name := KeyName("k")
	s.CreateKey(t, name, true)
	return name
}

// KeyName returns a fresh key name starting with prefix, without creating
// the key.
func KeyName(prefix string) string {
	return prefix + "-" + randomHex(6)
}

// RotateKey rotates the Transit key name.
func (s *Server) RotateKey(t testing.TB, name string) {
	t.Helper()
	if _, err := s.Client().Logical().Write("transit/keys/"+name+"/rotate", nil); err != nil {
		t.Fatalf("vaulttest: rotating transit key %q: %v", name, err)
	}
}

// Seal seals the server. A dev server stays sealed until it is stopped.
func (s *Server) Seal(t testing.TB) {
	t.Helper()
	if err := s.Client().Sys().Seal(); err != nil {
		t.Fatalf("vaulttest: sealing: %v", err)
	}
}

// Stop kills the server and waits for it to exit. It may be called more
// than once.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		if s.cmd.Process != nil {
			_ = s.cmd.Process.Kill()
			select {
			case <-s.exited:
			case <-time.After(10 * time.Second):
			}
		}
		os.RemoveAll(s.home)
	})
}

// outputTail returns the last lines the server printed.
func (s *Server) outputTail() string { return s.out.Tail(4000) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
