//go:build !linux

package kmstest

import "os/exec"

// setParentDeathSignal does nothing outside Linux.
func setParentDeathSignal(*exec.Cmd) {}
