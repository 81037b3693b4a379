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
)

// conformanceVersion pins the MCP conformance suite. 0.1.12 is the newest
// release that runs on Node.js 20.
const conformanceVersion = "0.1.12"

// TestConformance runs the MCP conformance suite in server mode twice:
// against the MCP Go SDK's everything-server directly, and against toolgate
// fronting it (integration/conformance/Caddyfile). toolgate must be
// invisible: every scenario must end with the same passed and failed checks
// both ways. `make conformance` runs it and prints both summaries.
func TestConformance(t *testing.T) {
	suite := conformanceSuite(t)
	upstreamPort := freePort(t)
	startEverythingServer(t, upstreamPort)

	gatewayPort := freePort(t)
	t.Setenv("CONFORMANCE_GATEWAY_PORT", strconv.Itoa(gatewayPort))
	t.Setenv("CONFORMANCE_UPSTREAM_PORT", strconv.Itoa(upstreamPort))
	t.Setenv("CONFORMANCE_DATA", t.TempDir())
	caddyfile, err := os.ReadFile(filepath.Join("conformance", "Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	loadCaddyfile(t, string(caddyfile))
	waitListening(t, fmt.Sprintf("http://127.0.0.1:%d", gatewayPort))

	direct := runConformance(t, suite, fmt.Sprintf("http://127.0.0.1:%d/mcp", upstreamPort))
	through := runConformance(t, suite, fmt.Sprintf("http://127.0.0.1:%d/v1/mcp/everything", gatewayPort))
	t.Logf("MCP conformance %s, directly against the everything-server:\n%s", conformanceVersion, direct.text)
	t.Logf("MCP conformance %s, through toolgate:\n%s", conformanceVersion, through.text)

	if len(direct.scenarios) == 0 {
		t.Fatal("the direct run reported no scenarios")
	}
	for name, want := range direct.scenarios {
		got, ok := through.scenarios[name]
		switch {
		case !ok:
			t.Errorf("%s: ran directly but not through toolgate", name)
		case got != want:
			t.Errorf("%s: directly %d passed, %d failed; through toolgate %d passed, %d failed",
				name, want.passed, want.failed, got.passed, got.failed)
		}
	}
	for name := range through.scenarios {
		if _, ok := direct.scenarios[name]; !ok {
			t.Errorf("%s: ran through toolgate but not directly", name)
		}
	}
}

type checkCounts struct{ passed, failed int }

type conformanceResult struct {
	text      string // the summary as printed
	scenarios map[string]checkCounts
}

var summaryLine = regexp.MustCompile(`^[✓✗] (\S+): (\d+) passed, (\d+) failed`)

// runConformance runs every active server scenario against url.
func runConformance(t *testing.T, suite, url string) conformanceResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", suite, "server", "--url", url)
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

// conformanceSuite installs the pinned suite from npm once into the cache
// and returns the path of its entry point.
func conformanceSuite(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		requirePeer(t, "Node.js 20 (node and npm) is needed for the MCP conformance suite")
	}
	dir := filepath.Join(cacheDir(t), "conformance-"+conformanceVersion)
	entry := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")
	if _, err := os.Stat(entry); err == nil {
		return entry
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("npm", "install", "--prefix", dir, "--no-audit", "--no-fund", "--loglevel=error",
		"@modelcontextprotocol/conformance@"+conformanceVersion)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm install @modelcontextprotocol/conformance@%s: %v\n%s", conformanceVersion, err, out)
	}
	if _, err := os.Stat(entry); err != nil {
		t.Fatalf("the conformance suite has no %s after npm install", entry)
	}
	return entry
}

// startEverythingServer builds the MCP Go SDK's conformance server at the
// SDK version in go.mod and runs it, stateful (server→client requests need
// a session), on port.
func startEverythingServer(t *testing.T, port int) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "everything-server")
	build := exec.Command("go", "build", "-o", bin, "github.com/modelcontextprotocol/go-sdk/conformance/everything-server")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the everything-server: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-http", fmt.Sprintf("127.0.0.1:%d", port), "-stateless=false")
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
