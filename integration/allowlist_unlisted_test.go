package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// An allowlisted tool the upstream does not list (a misspelled name in
// the registry's tools line) is warned of, once, naming it: runners can
// neither see nor call it, and nothing else would say why.
func TestAllowlistedToolsTheUpstreamDoesNotListAreWarnedOf(t *testing.T) {
	up := startUpstream(t)
	logFile := filepath.Join(t.TempDir(), "gateway.log")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo ecko", Log: "output file " + logFile + "\n\t\tlevel WARN"})
	for range 2 {
		m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
		m.initialize()
	}
	var warned []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		data, _ := os.ReadFile(logFile)
		warned = nil
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, "does not list tools the service's allowlist names") {
				warned = append(warned, line)
			}
		}
		if len(warned) > 0 {
			break
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], `"tools":["ecko"]`) || !strings.Contains(warned[0], `"service":"svc"`) {
		t.Errorf("warnings of unlisted allowlisted tools after two listings: %q, want one naming ecko", warned)
	}
}
