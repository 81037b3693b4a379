package integration

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
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
}
