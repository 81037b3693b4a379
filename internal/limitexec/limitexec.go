//go:build linux

// Package limitexec starts a program with its resource limits in force
// from its first instruction.
//
// Go cannot set a child's rlimits between fork and exec, and setting them
// on the child after it started (prlimit) leaves an instant in which the
// program runs, and may fork, unlimited: a child it forks then keeps no
// limits at all. So the program is started through this binary itself:
// [Command] names /proc/self/exe, the running toolgate (even when its
// file was since replaced), with argv[0] naming this package's step;
// this package's init sees that, sets the limits on its own process and
// execs the program, which inherits them — the same process, so its pid,
// process group, credentials and parent-death signal are those the
// caller arranged. It costs the program's start the toolgate binary's
// initialization (tens of milliseconds), and only programs with limits.
//
// The binary must be executable by the user the program runs as.
package limitexec

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// argv0 marks the step in argv[0]; the arguments after it are the pid of
// the process starting the program, the limits (data, open files,
// processes: 0 for none), the program's path and its argv.
const argv0 = "toolgate-limited-exec"

// self is the running binary, whatever its path is now.
const self = "/proc/self/exe"

// Limits are the limits to set; zero leaves one as it is.
type Limits struct {
	Data, OpenFiles, Processes int64
}

func (l Limits) none() bool { return l.Data <= 0 && l.OpenFiles <= 0 && l.Processes <= 0 }

// Command returns the path and argv that run path with argv under l: path
// and argv themselves when l sets no limit.
func Command(path string, argv []string, l Limits) (string, []string) {
	if l.none() {
		return path, argv
	}
	out := make([]string, 0, 6+len(argv))
	out = append(out, argv0, strconv.Itoa(os.Getpid()), strconv.FormatInt(max(l.Data, 0), 10), strconv.FormatInt(max(l.OpenFiles, 0), 10),
		strconv.FormatInt(max(l.Processes, 0), 10), path)
	return self, append(out, argv...)
}

func init() {
	if len(os.Args) == 0 || os.Args[0] != argv0 {
		return
	}
	err := run(os.Args[1:])
	fmt.Fprintf(os.Stderr, "toolgate: %v\n", err)
	os.Exit(127)
}

// run sets the limits args name and execs the program; it returns only
// when it cannot.
func run(args []string) error {
	if len(args) < 6 {
		return fmt.Errorf("starting the program: %d arguments, want at least 6", len(args))
	}
	parent, err := strconv.Atoi(args[0])
	if err != nil || parent <= 0 {
		return fmt.Errorf("starting the program: %q is not a process id", args[0])
	}
	args = args[1:]
	// The parent-death signal belongs to a thread, and the program is the
	// thread that calls execve: both on this one.
	runtime.LockOSThread()
	// The program dies with toolgate, as one started directly would. The
	// kernel clears the parent-death signal when this binary's exec is a
	// secure one (toolgate given file capabilities, such as binding port
	// 443 as another user than root), so it is set again here; and should
	// toolgate have died meanwhile, nothing is started.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("starting the program: %v", err)
	}
	if unix.Getppid() != parent {
		return errors.New("starting the program: toolgate, which started it, has ended")
	}
	for i, resource := range []int{unix.RLIMIT_DATA, unix.RLIMIT_NOFILE, unix.RLIMIT_NPROC} {
		v, err := strconv.ParseInt(args[i], 10, 64)
		if err != nil || v < 0 {
			return fmt.Errorf("starting the program: limit %q is not a count", args[i])
		}
		if v == 0 {
			continue
		}
		// Soft and hard alike, so the program cannot raise them. (x/sys's
		// Prlimit goes through the syscall package's, which then no
		// longer restores Go's original open-files limit at exec.)
		lim := unix.Rlimit{Cur: uint64(v), Max: uint64(v)}
		if err := unix.Prlimit(0, resource, &lim, nil); err != nil {
			return fmt.Errorf("setting resource limits: %v", err)
		}
	}
	if err := unix.Exec(args[3], args[4:], os.Environ()); err != nil {
		return fmt.Errorf("starting %s: %v", args[3], err)
	}
	return nil
}
