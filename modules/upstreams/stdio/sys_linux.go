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

// setLimits sets the process's resource limits (soft and hard alike, so
// the program cannot raise them).
func setLimits(pid int, l Limits) error {
	for _, r := range []struct {
		resource int
		value    int64
	}{{unix.RLIMIT_DATA, l.Memory}, {unix.RLIMIT_NOFILE, int64(l.OpenFiles)}, {unix.RLIMIT_NPROC, int64(l.Processes)}} {
		if r.value <= 0 {
			continue
		}
		lim := unix.Rlimit{Cur: uint64(r.value), Max: uint64(r.value)}
		if err := unix.Prlimit(pid, r.resource, &lim, nil); err != nil {
			return err
		}
	}
	return nil
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
