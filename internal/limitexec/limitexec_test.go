//go:build linux

package limitexec

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The program's very first instruction runs under the limits: a shell
// whose first commands print its limits prints the ones given, and so
// does a child it forks at once.
func TestLimitsHoldFromTheFirstInstruction(t *testing.T) {
	path, argv := Command("/bin/sh", []string{"sh", "-c", "ulimit -n; ulimit -d; (ulimit -Hn)"}, Limits{OpenFiles: 77, Data: 1 << 30})
	cmd := &exec.Cmd{Path: path, Args: argv}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := strings.Fields(string(out)); !slices.Equal(got, []string{"77", "1048576", "77"}) {
		t.Errorf("the program saw the limits %q, want 77 open files and 1 GiB of data from its start", got)
	}
}

// Without limits the program is started as it is; with bad arguments the
// step refuses to start anything.
func TestCommand(t *testing.T) {
	if path, argv := Command("/bin/true", []string{"true", "x"}, Limits{}); path != "/bin/true" || !slices.Equal(argv, []string{"true", "x"}) {
		t.Errorf("without limits: %s %q", path, argv)
	}
	parent := strconv.Itoa(os.Getppid())
	for _, args := range [][]string{
		{parent, "0", "0", "0", "/bin/true"},
		{parent, "x", "0", "0", "/bin/true", "true"},
		{parent, "-1", "0", "0", "/bin/true", "true"},
		{"1", "0", "0", "0", "/bin/true", "true"}, // toolgate (its parent) has ended
		{"x", "0", "0", "0", "/bin/true", "true"},
		{parent, "0", "0", "0", "/nonexistent/program", "program"},
	} {
		if err := run(args); err == nil {
			t.Errorf("run(%q) started something", args)
		}
	}
}
