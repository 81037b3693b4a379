package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/pgtest"
)

// The conformance suite, pinned, in two generations: 0.1.12 is the newest
// release that runs on Node.js 20 and checks the revisions that
// initialize; 0.2.0-alpha.12 checks the stateless revision (2026-07-28) and
// needs Node.js 22, which npm installs as the package node@22.23.3.
const (
	conformanceVersion     = "0.1.12"
	conformance2026Version = "0.2.0-alpha.12"
	node22Version          = "22.23.3"
)

// TestConformance runs the MCP conformance suite in server mode, directly
// against the MCP Go SDK's everything-server, through toolgate fronting it
// (integration/conformance/Caddyfile), and through three toolgate replicas
// (the same Caddyfile, on one PostgreSQL database) behind Caddy's
// reverse_proxy balancing round robin, so that consecutive requests of one
// MCP session land on different replicas. It does so in both generations:
// 0.1.12 against the server in stateful mode (server→client requests need
// a session), and 0.2.0-alpha.12 with the 2026-07-28 requirement set
// against the server in its default stateless mode, which speaks every
// revision. toolgate must be invisible: every scenario must end with the
// same passed and failed checks every way. `make conformance` runs it and
// prints the summaries.
func TestConformance(t *testing.T) {
	suite := conformanceSuite(t, conformanceVersion, "")
	node22 := nodeBin(t)
	suite2026 := conformanceSuite(t, conformance2026Version, node22)
	upstreamPort, statelessPort := freePort(t), freePort(t)
	startEverythingServer(t, upstreamPort, false)
	startEverythingServer(t, statelessPort, true)

	gatewayPort := freePort(t)
	gateway := fmt.Sprintf("http://127.0.0.1:%d", gatewayPort)
	t.Setenv("CONFORMANCE_GATEWAY_PORT", strconv.Itoa(gatewayPort))
	t.Setenv("CONFORMANCE_PUBLIC_URL", gateway)
	t.Setenv("CONFORMANCE_UPSTREAM_PORT", strconv.Itoa(upstreamPort))
	t.Setenv("CONFORMANCE_STATELESS_PORT", strconv.Itoa(statelessPort))
	t.Setenv("CONFORMANCE_STATE_SECRET", testStateSecret)
	t.Setenv("CONFORMANCE_STORAGE", "file_system "+t.TempDir())
	caddyfile, err := os.ReadFile(filepath.Join("conformance", "Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	loadCaddyfile(t, string(caddyfile))
	waitListening(t, gateway)
	balanced := startConformanceReplicas(t, string(caddyfile), 3)

	t.Run(conformanceVersion, func(t *testing.T) {
		direct := runConformance(t, suite, "", fmt.Sprintf("http://127.0.0.1:%d/mcp", upstreamPort))
		through := runConformance(t, suite, "", gateway+"/v1/mcp/everything")
		replicated := runConformance(t, suite, "", balanced+"/v1/mcp/everything")
		compareConformance(t, conformanceVersion, direct, map[string]conformanceResult{
			"through toolgate": through, "through three replicas behind a round-robin load balancer": replicated})
	})
	t.Run(conformance2026Version, func(t *testing.T) {
		direct := runConformance(t, suite2026, node22, fmt.Sprintf("http://127.0.0.1:%d/mcp", statelessPort), "--requirements", "2026-07-28")
		through := runConformance(t, suite2026, node22, gateway+"/v1/mcp/stateless", "--requirements", "2026-07-28")
		replicated := runConformance(t, suite2026, node22, balanced+"/v1/mcp/stateless", "--requirements", "2026-07-28")
		compareConformance(t, conformance2026Version+" (2026-07-28)", direct, map[string]conformanceResult{
			"through toolgate": through, "through three replicas behind a round-robin load balancer": replicated})
	})
}

// startConformanceReplicas runs n toolgate processes with the conformance
// Caddyfile on one PostgreSQL database, and a round-robin load balancer in
// front of them, whose URL it returns.
func startConformanceReplicas(t *testing.T, caddyfile string, n int) string {
	t.Helper()
	bin := toolgateBinary(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	lbPort := freePort(t)
	lb := fmt.Sprintf("http://127.0.0.1:%d", lbPort)
	var backends []string
	for range n {
		port := freePort(t)
		base := fmt.Sprintf("http://127.0.0.1:%d", port)
		env := []string{"CONFORMANCE_GATEWAY_PORT=" + strconv.Itoa(port), "CONFORMANCE_PUBLIC_URL=" + lb,
			"CONFORMANCE_STORAGE=postgres " + dsn}
		startProcess(t, bin, "toolgate replica at "+base, caddyfile, env, func() bool {
			_, err := httpStatus(base + "/v1/mcp/everything")
			return err == nil
		})
		backends = append(backends, strings.TrimPrefix(base, "http://"))
	}
	startBalancer(t, bin, lbPort, backends)
	return lb
}

// compareConformance fails on any scenario whose checks differ between the
// direct run and one of the others (by how they ran).
func compareConformance(t *testing.T, what string, direct conformanceResult, others map[string]conformanceResult) {
	t.Helper()
	t.Logf("MCP conformance %s, directly against the everything-server:\n%s", what, direct.text)
	if len(direct.scenarios) == 0 {
		t.Fatal("the direct run reported no scenarios")
	}
	for how, through := range others {
		t.Logf("MCP conformance %s, %s:\n%s", what, how, through.text)
		for name, want := range direct.scenarios {
			got, ok := through.scenarios[name]
			switch {
			case !ok:
				t.Errorf("%s: ran directly but not %s", name, how)
			case got != want:
				t.Errorf("%s: directly %d passed, %d failed; %s %d passed, %d failed",
					name, want.passed, want.failed, how, got.passed, got.failed)
			}
		}
		for name := range through.scenarios {
			if _, ok := direct.scenarios[name]; !ok {
				t.Errorf("%s: ran %s but not directly", name, how)
			}
		}
	}
}

type checkCounts struct{ passed, failed int }

type conformanceResult struct {
	text      string // the summary as printed
	scenarios map[string]checkCounts
}

var summaryLine = regexp.MustCompile(`^[✓✗] (\S+): (\d+) passed, (\d+) failed`)

// runConformance runs every active server scenario against url, with the
// node binary given ("" for the one on PATH).
func runConformance(t *testing.T, suite, node, url string, args ...string) conformanceResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if node == "" {
		node = "node"
	}
	cmd := exec.CommandContext(ctx, node, append([]string{suite, "server", "--url", url}, args...)...)
	cmd.Dir = t.TempDir() // the suite writes results/ into its working directory
	out, err := cmd.CombinedOutput()
	res := conformanceResult{scenarios: map[string]checkCounts{}}
	var summary strings.Builder
	inSummary := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "=== SUMMARY ===") {
			inSummary = true
		}
		if !inSummary {
			continue
		}
		summary.WriteString(line + "\n")
		if m := summaryLine.FindStringSubmatch(line); m != nil {
			p, _ := strconv.Atoi(m[2])
			f, _ := strconv.Atoi(m[3])
			res.scenarios[m[1]] = checkCounts{p, f}
		}
	}
	res.text = summary.String()
	if !inSummary {
		t.Fatalf("the conformance suite printed no summary (%v):\n%s", err, out)
	}
	return res
}

// conformanceSuite installs the suite at version from npm once into the
// cache (with the npm of node's directory, "" for the one on PATH) and
// returns the path of its entry point.
func conformanceSuite(t *testing.T, version, node string) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		requirePeer(t, "Node.js 20 (node and npm) is needed for the MCP conformance suite")
	}
	dir := filepath.Join(cacheDir(t), "conformance-"+version)
	entry := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")
	if _, err := os.Stat(entry); err == nil {
		return entry
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("npm", "install", "--prefix", dir, "--no-audit", "--no-fund", "--loglevel=error",
		"@modelcontextprotocol/conformance@"+version)
	if node != "" {
		cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(node)+string(os.PathListSeparator)+os.Getenv("PATH"))
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm install @modelcontextprotocol/conformance@%s: %v\n%s", version, err, out)
	}
	if _, err := os.Stat(entry); err != nil {
		t.Fatalf("the conformance suite has no %s after npm install", entry)
	}
	return entry
}

// nodeBin installs Node.js 22 from npm (the package node@22.23.3, which
// ships the binary) once into the cache and returns the path of node.
func nodeBin(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("npm"); err != nil {
		requirePeer(t, "npm is needed to install Node.js 22 for the MCP conformance suite")
	}
	dir := filepath.Join(cacheDir(t), "node-"+node22Version)
	bin := filepath.Join(dir, "node_modules", ".bin", "node")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("npm", "install", "--prefix", dir, "--no-audit", "--no-fund", "--loglevel=error", "node@"+node22Version)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm install node@%s: %v\n%s", node22Version, err, out)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no %s after npm install node@%s", bin, node22Version)
	}
	return bin
}

// startEverythingServer builds the MCP Go SDK's conformance server at the
// SDK version in go.mod and runs it on port, stateful (server→client
// requests need a session) or stateless (every revision, 2026-07-28
// included).
func startEverythingServer(t *testing.T, port int, stateless bool) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "everything-server")
	build := exec.Command("go", "build", "-o", bin, "github.com/modelcontextprotocol/go-sdk/conformance/everything-server")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the everything-server: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-http", fmt.Sprintf("127.0.0.1:%d", port), "-stateless="+strconv.FormatBool(stateless))
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("everything-server output:\n%s", logs.String())
		}
	})
	waitListening(t, fmt.Sprintf("http://127.0.0.1:%d", port))
}

// cacheDir is where peers built or fetched for tests are kept between runs.
func cacheDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("TOOLGATE_CACHE"); d != "" {
		return d
	}
	d, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(d, "toolgate")
}

// requirePeer skips a test whose peer is missing, or fails it when
// TOOLGATE_REQUIRE_PEERS=1 (as make test sets): CI never skips silently.
func requirePeer(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("TOOLGATE_REQUIRE_PEERS") == "1" {
		t.Fatal(why)
	}
	t.Skip(why)
}
