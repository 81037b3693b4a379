//go:build linux

package limitexec

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Attack: programs with limits are started through /proc/self/exe (this
// binary) and from there exec'd. A toolgate binary given file capabilities
// — setcap cap_net_bind_service=+ep, the usual way to let a non-root Caddy
// bind ports 80 and 443 — makes that first execve a secure exec
// (AT_SECURE), and the kernel clears the parent-death signal on a secure
// exec: the Pdeathsig: SIGKILL that stdio's sysProcAttr asks for ("has the
// kernel kill it should toolgate itself die") is gone before the program's
// first instruction. A toolgate killed (OOM, SIGKILL) leaves its programs
// running, each with its user's credential in its environment. Before,
// the program was exec'd directly and kept the signal.
//
// The test copies this test binary, gives the copy a file capability,
// runs it as nobody, and has it start a program (a second copy, without
// capabilities) as stdio does, with and without limits; the program
// reports its parent-death signal.
func TestRegressionAttackFileCapabilitiesDropParentDeathSignal(t *testing.T) {
	skip := t.Skip
	if os.Getenv("TOOLGATE_REQUIRE_PEERS") != "" {
		skip = t.Fatal
	}
	if os.Geteuid() != 0 {
		skip("needs root to set a file capability and run as nobody")
	}
	setcap, err := exec.LookPath("setcap")
	if err != nil {
		if setcap, err = exec.LookPath("/usr/sbin/setcap"); err != nil {
			skip("no setcap (apt-get install libcap2-bin)")
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "limitexec-caps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	withCaps, plain := filepath.Join(dir, "toolgate"), filepath.Join(dir, "program")
	for _, p := range []string{withCaps, plain} {
		if err := copyFile(self, p); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command(setcap, "cap_net_bind_service=+ep", withCaps).CombinedOutput(); err != nil {
		t.Skipf("setcap: %v %s", err, out)
	}
	run := func(limited bool) string {
		cmd := exec.Command(withCaps, "-test.run=^TestRegressionAttackZHelperProcess$")
		cmd.Env = []string{"LIMITEXEC_HELPER=parent", "LIMITEXEC_PROGRAM=" + plain, fmt.Sprintf("LIMITEXEC_LIMITED=%v", limited)}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helper: %v\n%s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(line, "PDEATHSIG="); ok {
				return v
			}
		}
		t.Fatalf("helper printed no PDEATHSIG:\n%s", out)
		return ""
	}
	if got := run(false); got != "9" {
		t.Skipf("without limits the program's parent-death signal is %s already", got)
	}
	if got := run(true); got != "9" {
		t.Errorf("a program started with limits by a toolgate with a file capability has parent-death signal %s, want 9 (SIGKILL, as without limits): it outlives toolgate", got)
	}
}

// TestRegressionAttackZHelperProcess is the helper of the test above; it
// does nothing in a normal run.
func TestRegressionAttackZHelperProcess(t *testing.T) {
	switch os.Getenv("LIMITEXEC_HELPER") {
	case "parent":
		program := os.Getenv("LIMITEXEC_PROGRAM")
		argv := []string{"program", "-test.run=^TestRegressionAttackZHelperProcess$"}
		path := program
		if os.Getenv("LIMITEXEC_LIMITED") == "true" {
			path, argv = Command(program, argv, Limits{OpenFiles: 256})
		}
		cmd := &exec.Cmd{Path: path, Args: argv, Env: []string{"LIMITEXEC_HELPER=report"}, Stdout: os.Stdout, Stderr: os.Stderr,
			SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}}
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
	}
}

// The report is read in init, on the program's first thread: the
// parent-death signal belongs to the thread that exec'd (a thread the Go
// runtime starts later has none), and a test runs on any thread.
func init() {
	if os.Getenv("LIMITEXEC_HELPER") != "report" {
		return
	}
	var sig int
	if err := unix.Prctl(unix.PR_GET_PDEATHSIG, uintptr(unsafe.Pointer(&sig)), 0, 0, 0); err != nil {
		fmt.Println("PDEATHSIG error:", err)
		os.Exit(1)
	}
	fmt.Printf("PDEATHSIG=%d\n", sig)
	os.Exit(0)
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
