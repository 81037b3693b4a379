package kmstest

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal makes the kernel kill the server if the test binary
// dies without cleaning up.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
