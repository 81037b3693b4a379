package pgtest

import (
	"os/exec"
	"syscall"
)

// setSysProcAttr runs cmd as runAs (when not nil) and makes the kernel stop
// it with SIGQUIT (PostgreSQL's immediate shutdown) if the test binary dies
// without cleaning up.
func setSysProcAttr(cmd *exec.Cmd, runAs *syscall.Credential) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: runAs, Pdeathsig: syscall.SIGQUIT}
}
