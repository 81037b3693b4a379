package stdio

import (
	"math"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

func supported() error { return nil }

// sysProcAttr puts the program in a process group of its own (so that
// toolgate can signal it and everything it started), under u when set, and
// has the kernel kill it should toolgate itself die.
func sysProcAttr(u *runUser) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if u != nil {
		a.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
	}
	return a
}

// closeOnExec marks every descriptor above stderr close-on-exec. Go opens
// its own that way, but toolgate may have inherited others from whatever
// started it, and a program must get none of them.
func closeOnExec() error {
	if err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return nil
	}
	entries, err := os.ReadDir("/proc/self/fd") // kernels before 5.11
	if err != nil {
		return err
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
		}
	}
	return nil
}
