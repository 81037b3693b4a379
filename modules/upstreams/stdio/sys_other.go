//go:build !linux

package stdio

import (
	"errors"
	"syscall"
)

func supported() error {
	return errors.New("transport stdio: toolgate runs programs on Linux only")
}

func sysProcAttr(*runUser) *syscall.SysProcAttr { return nil }

func closeOnExec() error { return nil }
