// Package pgtest starts throwaway PostgreSQL clusters for tests.
//
// A cluster is a copy, in a fresh temporary directory, of one made by
// initdb once per test binary. It runs as a child of the test binary (the
// recorded PID is the postmaster itself), listening on a free loopback port
// and on a Unix socket in that directory, and has one superuser,
// "toolgate", who connects without a password (trust authentication,
// loopback only). Removing a cluster deletes its directory.
//
// The PostgreSQL binaries come from TOOLGATE_PGBIN, or else from the newest
// /usr/lib/postgresql/*/bin (Debian's postgresql package). PostgreSQL refuses
// to run as root: when the tests run as root, initdb and postgres run as the
// "postgres" user that package creates; otherwise as the current user.
// Without the binaries, tests that need PostgreSQL are skipped, or fail when
// TOOLGATE_REQUIRE_PEERS=1 (as in CI).
//
// Tests of one package share a cluster with [Shared] (started on first use)
// and start their own with [Start] when they stop or restart it. Call
// [StopShared] from TestMain after m.Run: it stops the shared cluster and
// removes the initdb template.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolgate/toolgate/internal/testproc"
)

// Environment variables read by this package.
const (
	EnvPGBin        = "TOOLGATE_PGBIN"
	EnvRequirePeers = "TOOLGATE_REQUIRE_PEERS"
)

// User is the cluster's superuser.
const User = "toolgate"

// startTimeout bounds how long a cluster may take to accept connections.
const startTimeout = 30 * time.Second

// Server is a running (or stopped, see [Server.Stop]) PostgreSQL cluster.
type Server struct {
	// Port is the loopback TCP port the server listens on.
	Port int

	bin     string
	dir     string // owns data/ and the Unix socket
	runAs   *syscall.Credential
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	out     *testproc.Output
	removed bool
}

// DSN returns a connection string for database db ("postgres" always
// exists) as the superuser.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", User, s.Port, db)
}

// Start creates and starts a cluster for t alone, and removes it when t
// ends. Use it for tests that stop or restart the server; others can share
// one with [Shared].
func Start(t testing.TB) *Server {
	t.Helper()
	bin, runAs := binaries(t)
	s, err := create(bin, runAs)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("postgres output (tail):\n%s", s.outputTail())
		}
		s.Remove()
	})
	return s
}

var shared struct {
	once sync.Once
	s    *Server
	err  error
}

// Shared returns a cluster shared by every test of the test binary,
// starting it on first use. Tests sharing it must not stop it, and should
// each use their own tables or databases ([Server.CreateDatabase]). Call
// [StopShared] from TestMain after m.Run.
func Shared(t testing.TB) *Server {
	t.Helper()
	bin, runAs := binaries(t)
	shared.once.Do(func() { shared.s, shared.err = create(bin, runAs) })
	if shared.err != nil {
		t.Fatalf("pgtest: %v", shared.err)
	}
	return shared.s
}

// StopShared stops and removes the cluster started by [Shared], if any,
// and the template every cluster of the test binary was copied from.
func StopShared() {
	if shared.s != nil {
		shared.s.Remove()
	}
	if template.dir != "" {
		os.RemoveAll(template.dir)
	}
}

// CreateDatabase creates a database with a fresh name and returns its DSN.
func (s *Server) CreateDatabase(t testing.TB) string {
	t.Helper()
	name := "db_" + randomHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		t.Fatalf("pgtest: connecting: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: creating database %s: %v", name, err)
	}
	return s.DSN(name)
}

// binaries returns the directory of the PostgreSQL binaries and the user to
// run them as (nil: the current user), or skips (or fails) t.
func binaries(t testing.TB) (string, *syscall.Credential) {
	t.Helper()
	bin, err := findBin()
	if err == nil && os.Geteuid() == 0 {
		var runAs *syscall.Credential
		runAs, err = postgresUser()
		if err == nil {
			return bin, runAs
		}
	}
	if err != nil {
		msg := err.Error() + ": install Debian's postgresql package (apt-get install postgresql) or set " + EnvPGBin
		if os.Getenv(EnvRequirePeers) == "1" {
			t.Fatal(msg + " (" + EnvRequirePeers + "=1 makes this a failure)")
		}
		t.Skip(msg)
	}
	return bin, nil
}

func findBin() (string, error) {
	if dir := os.Getenv(EnvPGBin); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err != nil {
			return "", fmt.Errorf("%s=%s holds no postgres binary", EnvPGBin, dir)
		}
		return dir, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	var found []string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			found = append(found, d)
		}
	}
	if len(found) == 0 {
		return "", errors.New("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin")
	}
	version := func(d string) int {
		v, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		return v
	}
	sort.Slice(found, func(i, j int) bool { return version(found[i]) > version(found[j]) })
	return found[0], nil
}

// postgresUser returns the credentials of the "postgres" user.
func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.New("running as root, and there is no postgres user to run PostgreSQL as")
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("postgres user has uid %q, gid %q", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// template is a data directory made by initdb once per test binary;
// every cluster starts as a copy of it (much cheaper than initdb).
var template struct {
	once sync.Once
	dir  string
	err  error
}

// templateDir runs initdb once and returns the directory holding data/.
func templateDir(bin string, runAs *syscall.Credential) (string, error) {
	template.once.Do(func() {
		dir, err := newDir(runAs)
		if err != nil {
			template.err = err
			return
		}
		s := &Server{dir: dir, runAs: runAs}
		initdb := s.command(filepath.Join(bin, "initdb"),
			"-D", s.dataDir(), "-U", User, "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
		if out, err := initdb.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			template.err = fmt.Errorf("initdb: %v\n%s", err, out)
			return
		}
		template.dir = dir
	})
	return template.dir, template.err
}

// newDir makes a temporary directory owned by runAs.
func newDir(runAs *syscall.Credential) (string, error) {
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return "", err
	}
	if runAs != nil {
		if err := os.Chown(dir, int(runAs.Uid), int(runAs.Gid)); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

// create makes a cluster from the template in a fresh directory and
// starts it.
func create(bin string, runAs *syscall.Credential) (*Server, error) {
	tmpl, err := templateDir(bin, runAs)
	if err != nil {
		return nil, err
	}
	dir, err := newDir(runAs)
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, runAs: runAs, out: new(testproc.Output)}
	// cp -a keeps owners and modes (PostgreSQL insists on 0700 or 0750)
	if out, err := exec.Command("cp", "-a", filepath.Join(tmpl, "data"), s.dataDir()).CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("copying the template cluster: %v\n%s", err, out)
	}
	for range 3 {
		if s.Port, err = testproc.FreePort(); err != nil {
			break
		}
		if err = s.start(); err == nil || !strings.Contains(err.Error(), "could not bind") {
			break
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func (s *Server) dataDir() string { return filepath.Join(s.dir, "data") }

// command prepares a PostgreSQL program to run as the cluster's user, in the
// cluster's directory, with an environment free of PG* variables.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = s.dir
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG") {
			continue
		}
		env = append(env, kv)
	}
	cmd.Env = append(env, "LC_ALL=C")
	setSysProcAttr(cmd, s.runAs)
	return cmd
}

// start runs the postmaster and waits until it accepts connections.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd := s.command(filepath.Join(s.bin, "postgres"),
		"-D", s.dataDir(),
		"-p", strconv.Itoa(s.Port),
		"-k", s.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
	)
	cmd.Stdout = s.out
	cmd.Stderr = s.out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting postgres: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err == nil {
			_ = conn.Close(ctx)
			cancel()
			return nil
		}
		cancel()
		select {
		case <-exited:
			return fmt.Errorf("postgres exited before accepting connections:\n%s", s.outputTail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("postgres did not accept connections within %s:\n%s", startTimeout, s.outputTail())
		}
	}
}

// Stop shuts the server down at once (an immediate shutdown, like a crash:
// the next start recovers from the write-ahead log) and keeps its data, so
// that [Server.Restart] can start it again on the same port.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.kill(); err != nil {
		t.Fatalf("pgtest: stopping postgres: %v", err)
	}
}

// Restart starts a stopped server again with the same data and port.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.start(); err != nil {
		t.Fatalf("pgtest: restarting postgres: %v", err)
	}
}

// kill sends the postmaster SIGQUIT (immediate shutdown), then SIGKILL if
// it has not exited within 10 s, and waits for it. s.mu is held.
func (s *Server) kill() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	select {
	case <-s.exited:
		return nil
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-s.exited:
		return nil
	case <-time.After(10 * time.Second):
	}
	_ = s.cmd.Process.Kill()
	select {
	case <-s.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("postgres (pid %d) did not exit", s.cmd.Process.Pid)
	}
}

// Remove stops the server and deletes its directory. It may be called more
// than once.
func (s *Server) Remove() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.kill()
	if !s.removed {
		s.removed = true
		os.RemoveAll(s.dir)
	}
}

// outputTail returns the last lines the server printed.
func (s *Server) outputTail() string { return s.out.Tail(4000) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
