package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A server is one party of the comparison running as its own process. The
// process is exec'd directly, never through a shell, so its PID is the
// server itself: CPU and memory are read for that PID, and stopping that
// PID stops the server (Caddy listens with SO_REUSEPORT, so a leftover
// server would silently share a port with the next run).
type server struct {
	name   string
	cmd    *exec.Cmd
	pid    int
	logs   string // the file holding its stdout and stderr
	exited chan struct{}
}

// startServer runs bin with args, its output going to dir/name.log. The
// process gets SIGKILL should this program die first, so no server
// outlives a crashed or interrupted run.
func startServer(name, dir, bin string, env []string, args ...string) (*server, error) {
	logs := filepath.Join(dir, name+".log")
	out, err := os.Create(logs)
	if err != nil {
		return nil, err
	}
	defer out.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %v", name, err)
	}
	s := &server{name: name, cmd: cmd, pid: cmd.Process.Pid, logs: logs, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	return s, nil
}

// waitListening waits until addr accepts TCP connections, failing early
// when the server exits.
func (s *server) waitListening(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("%s (pid %d) exited before it listened on %s:\n%s", s.name, s.pid, addr, s.tail())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s (pid %d) did not listen on %s within %s:\n%s", s.name, s.pid, addr, within, s.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// alive reports an error when the server has exited.
func (s *server) alive() error {
	select {
	case <-s.exited:
		return fmt.Errorf("%s (pid %d) exited during the run:\n%s", s.name, s.pid, s.tail())
	default:
		return nil
	}
}

// stop ends the server by its PID: SIGINT (Caddy shuts down gracefully),
// SIGKILL when it has not exited 5 seconds later.
func (s *server) stop() {
	_ = s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.exited:
		return
	case <-time.After(5 * time.Second):
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// tail returns the last few KiB of the server's output.
func (s *server) tail() string {
	data, err := os.ReadFile(s.logs)
	if err != nil {
		return err.Error()
	}
	if len(data) > 4096 {
		data = data[len(data)-4096:]
	}
	return string(data)
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// cpuSeconds returns the user plus system CPU time the process has used.
func cpuSeconds(pid int) (float64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	ticks, err := parseStatCPU(data)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %v", pid, err)
	}
	return float64(ticks) / clockTicks, nil
}

// parseStatCPU returns utime+stime (fields 14 and 15) of a /proc/<pid>/stat
// line. The command name (field 2) is in parentheses and may itself hold
// spaces and parentheses, so fields are counted after its last ')'.
func parseStatCPU(stat []byte) (uint64, error) {
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, errors.New("no command name")
	}
	// After ") " come field 3 (state) onwards: utime is field 14, the
	// 12th of these.
	fields := strings.Fields(string(stat[end+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want at least 13", len(fields))
	}
	utime, err := strconv.ParseUint(fields[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("utime: %v", err)
	}
	stime, err := strconv.ParseUint(fields[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stime: %v", err)
	}
	return utime + stime, nil
}

// rssBytes returns the process's resident set size (VmRSS).
func rssBytes(pid int) (int64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	return parseStatusRSS(data)
}

// parseStatusRSS reads the VmRSS line of /proc/<pid>/status.
func parseStatusRSS(status []byte) (int64, error) {
	for line := range strings.Lines(string(status)) {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("VmRSS line %q", strings.TrimSpace(line))
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("VmRSS: %v", err)
		}
		return kb * 1024, nil
	}
	return 0, errors.New("no VmRSS line")
}

// loadAverage returns the 1, 5 and 15 minute load averages of
// /proc/loadavg.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// machine describes where the run happens: CPU model and count.
func machine() string {
	model := "unknown CPU"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(data)) {
			if name, ok := strings.CutPrefix(line, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
				break
			}
		}
	}
	cpus := 0
	if data, err := os.ReadFile("/sys/fs/cgroup/cpu.max"); err == nil {
		if f := strings.Fields(string(data)); len(f) == 2 && f[0] != "max" {
			q, _ := strconv.Atoi(f[0])
			p, _ := strconv.Atoi(f[1])
			if p > 0 {
				cpus = q / p
			}
		}
	}
	if cpus == 0 {
		cpus = runtime.NumCPU()
	}
	return fmt.Sprintf("%d × %s", cpus, model)
}

// settle waits until the process has used less than 2% of a CPU over a
// quarter second (its background work after a phase is done), for at most
// within.
func settle(ctx context.Context, pid int, within time.Duration) {
	deadline := time.Now().Add(within)
	prev, _ := cpuSeconds(pid)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(250 * time.Millisecond)
		now, err := cpuSeconds(pid)
		if err != nil || now-prev < 0.005 {
			return
		}
		prev = now
	}
}
