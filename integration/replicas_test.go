package integration

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/pgtest"
)

// A replica is the real toolgate binary running as its own process, so that
// several of them can share one storage as gateway replicas do.

// toolgateBuild is the toolgate binary built for this test binary.
var toolgateBuild struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// toolgateBinary builds ./cmd/toolgate once per test binary; TestMain
// removes it. It is built without the race detector, which would make the
// replicas several times slower (tests that run three of them and a load
// balancer on a small machine would measure the detector), and whose
// reports in a child process would fail no test: the in-process tests run
// the same code under -race.
func toolgateBinary(t testing.TB) string {
	t.Helper()
	b := &toolgateBuild
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "toolgate-bin-"); b.err != nil {
			return
		}
		b.bin = filepath.Join(b.dir, "toolgate")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", b.bin, "github.com/toolgate/toolgate/cmd/toolgate")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build ./cmd/toolgate: %v\n%s", err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.bin
}

// removeToolgateBinary removes what toolgateBinary built.
func removeToolgateBinary() {
	if toolgateBuild.dir != "" {
		_ = os.RemoveAll(toolgateBuild.dir)
	}
}

// process is a toolgate binary running as a child of the test, with the
// recorded PID the server itself.
type process struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	out    *lockedBuffer
}

// startProcess runs bin with the Caddyfile caddyfile (written to a file)
// and the environment env added to this process's, until ready reports
// true (at most 60s), and kills it when t ends.
func startProcess(t testing.TB, bin, name, caddyfile string, env []string, ready func() bool) *process {
	t.Helper()
	cfgFile := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(cfgFile, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &process{name: name, exited: make(chan struct{}), out: new(lockedBuffer)}
	p.cmd = exec.Command(bin, "run", "--config", cfgFile, "--adapter", "caddyfile")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.Env = append(append(os.Environ(), "HOME="+t.TempDir(), "XDG_DATA_HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir()), env...)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill(t)
		if t.Failed() {
			t.Logf("%s printed (tail):\n%s", name, p.out.tail(16<<10))
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for !ready() {
		select {
		case <-p.exited:
			t.Fatalf("%s exited before it served:\n%s", name, p.out.tail(16<<10))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not start within 60s:\n%s", name, p.out.tail(16<<10))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p
}

// kill ends the process at once (SIGKILL, as a crash or an OOM kill
// would) and waits until it is gone: its sockets are closed then.
func (p *process) kill(t testing.TB) {
	_ = p.cmd.Process.Kill()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Errorf("%s (pid %d) did not exit", p.name, p.cmd.Process.Pid)
	}
}

// replica is one running toolgate process.
type replica struct {
	*gateway
	*process
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
	return startReplicaAt(t, bin, port, base, toolgateBlock, dataDir, policyDir, "")
}

// startReplicaAt is startReplicaWith on port, with publicURL as the
// gateway's public_url (a load balancer's, for replicas behind one) and
// policyExtra in its toolgate_policy block; its site answers any host,
// like a replica behind a load balancer, and serves the federated
// endpoint (/v1/mcp) besides the services' endpoints.
func startReplicaAt(t testing.TB, bin string, port int, publicURL, toolgateBlock, dataDir, policyDir, policyExtra string) *replica {
	t.Helper()
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

http://:%[5]d {
	bind 127.0.0.1
	@mcp path /v1/mcp /v1/mcp/*
	route @mcp {
		toolgate_session
		toolgate_federation
		toolgate_registry
		toolgate_policy {
			source %[4]s
			timeout 30s
			%[6]s
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
`, publicURL, toolgateBlock, dataDir, policyDir, port, policyExtra)
	ready := func() bool {
		status, err := httpStatus(base + "/.well-known/oauth-protected-resource")
		return err == nil && status == http.StatusOK
	}
	p := startProcess(t, bin, "toolgate at "+base, caddyfile, nil, ready)
	return &replica{gateway: &gateway{URL: base, DataDir: dataDir}, process: p}
}

// startBalancer runs Caddy's reverse_proxy (the toolgate binary is a Caddy
// with every standard module) over backends, round robin, with the
// configuration of testdata/balancer.Caddyfile, on port.
func startBalancer(t testing.TB, bin string, port int, backends []string) *process {
	t.Helper()
	caddyfile, err := os.ReadFile(testdataPath(t, "balancer.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	env := []string{fmt.Sprintf("BALANCER_PORT=%d", port), "BALANCER_BACKENDS=" + strings.Join(backends, " ")}
	return startProcess(t, bin, "the load balancer at "+base, string(caddyfile), env, func() bool {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// replicaBlock is the toolgate block of test replicas: the test state
// secret, the storage line, a local cipher key in data (the first replica
// creates it, the others read it), alice's and bob's API keys, and service svc at
// upstream with the allowlist tools and the extra lines.
func replicaBlock(storage, data, upstream, tools, extra string) string {
	return fmt.Sprintf(`state_secret %s
		%s
		cipher local %s/cipher.key
		auth {
			api_key %s %s
			api_key %s %s
		}
		service svc {
			url %s
			allow_http
			tools %s
			%s
		}`, testStateSecret, storage, data, hashKey(aliceKey), alice, hashKey(bobKey), bob, upstream, tools, extra)
}

// twoReplicas starts an upstream with the allowlist tools and two replicas
// of the toolgate binary in front of it on a fresh PostgreSQL database,
// with the policies of policyDir. It skips in -short mode.
func twoReplicas(t *testing.T, tools, policyDir string) (up *upstream, a, b *replica) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	up = startUpstream(t)
	data := t.TempDir()
	block := replicaBlock(postgresStorage(t), data, up.URL, tools, "")
	a = startReplicaWith(t, bin, block, data, policyDir)
	b = startReplicaWith(t, bin, block, data, policyDir)
	return up, a, b
}

// postgresStorage returns the storage line of a toolgate block for a fresh
// database of the test binary's PostgreSQL cluster.
func postgresStorage(t testing.TB) string {
	t.Helper()
	return "storage postgres " + pgtest.Shared(t).CreateDatabase(t)
}

// Three replicas on one PostgreSQL database: fifty calls that all find the
// access token expired, spread over the three, make exactly one refresh.
func TestOAuthRefreshStampedeAcrossThreeReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	// The first access token lives four seconds (the runners initialize
	// on the three replicas meanwhile); the refreshed one an hour.
	p := startOAuthProvider(t, providerConfig{AccessTTL: 4 * time.Second, RefreshedAccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	data := t.TempDir()
	block := replicaBlock(postgresStorage(t), data, up.URL, "echo", "auth "+oauthBlock(p, ""))

	// One after the other: the first creates the shared cipher key.
	a := startReplica(t, bin, block, data)
	b := startReplica(t, bin, block, data)
	c := startReplica(t, bin, block, data)
	p.allowRedirect(a.URL + "/v1/connections/svc/callback")

	a.connectOAuth(t, aliceKey)
	connectedAt := time.Now()
	sess := a.createSession(t, aliceKey, "svc") // sessions live in the shared storage
	runners := []*rawMCP{a.raw(t, aliceKey, sess, "svc"), b.raw(t, aliceKey, sess, "svc"), c.raw(t, aliceKey, sess, "svc")}
	for _, m := range runners {
		m.initialize()
	}
	if len(p.refreshes()) != 0 {
		t.Fatal("a refresh happened before the token expired (the machine is too slow for a four-second token)")
	}
	time.Sleep(time.Until(connectedAt.Add(4*time.Second + 150*time.Millisecond)))

	errs := concurrentEchoes(50, runners...)
	for _, err := range errs {
		t.Error(err)
	}
	if n := len(p.refreshes()); n != 1 {
		t.Fatalf("50 concurrent calls through three replicas made %d refreshes at the provider, want exactly 1", n)
	}
	p.checkRotation(t)
	if _, refused := up.seen(); refused != 0 {
		t.Errorf("the upstream refused %d requests", refused)
	}
	for _, g := range []*replica{a, b, c} {
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
