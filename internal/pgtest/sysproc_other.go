//go:build unix && !linux

package pgtest

import (
	"os/exec"
	"syscall"
)

// setSysProcAttr runs cmd as runAs (when not nil).
func setSysProcAttr(cmd *exec.Cmd, runAs *syscall.Credential) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: runAs}
}
