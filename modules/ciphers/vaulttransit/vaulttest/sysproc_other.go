//go:build !linux

package vaulttest

import "os/exec"

// setParentDeathSignal does nothing outside Linux.
func setParentDeathSignal(*exec.Cmd) {}
