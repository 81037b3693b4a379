package postgres

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/toolgate/toolgate/internal/testproc"
)

// Helper processes: the test binary started again with envHelper set runs
// helperMain instead of the tests, as another replica would.
const (
	envHelper  = "TOOLGATE_PGSTORE_HELPER"
	envDSN     = "TOOLGATE_PGSTORE_DSN"
	envTable   = "TOOLGATE_PGSTORE_TABLE"
	envLease   = "TOOLGATE_PGSTORE_LEASE"
	envCount   = "TOOLGATE_PGSTORE_COUNT"
	envHoldFor = "TOOLGATE_PGSTORE_HOLD_FOR"
)

// helperMain runs one helper mode and returns the exit code:
//
//   - increment: envCount times, take the lock "counter", read the key
//     "counter", record the fence under log/<new value>, store the new
//     value, release;
//   - hold: take the lock "held", print "locked <fence>", then wait to be
//     killed, or (with envHoldFor) hold it that long, release it and
//     print "released".
func helperMain(mode string) int {
	lease, _ := time.ParseDuration(os.Getenv(envLease))
	s := &Storage{DSN: os.Getenv(envDSN), Table: os.Getenv(envTable), LockLease: caddy.Duration(lease)}
	cctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := s.Provision(cctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Cleanup()
	ctx, stop := context.WithTimeout(context.Background(), 60*time.Second)
	defer stop()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, err); return 1 }
	switch mode {
	case "increment":
		n, _ := strconv.Atoi(os.Getenv(envCount))
		for range n {
			if err := s.Lock(ctx, "counter"); err != nil {
				return fail(err)
			}
			v := 0
			b, err := s.Load(ctx, "counter")
			switch {
			case err == nil:
				v, _ = strconv.Atoi(string(b))
			case !errors.Is(err, fs.ErrNotExist):
				return fail(err)
			}
			time.Sleep(time.Millisecond) // widen the window a lost update needs
			fence, ok := s.Fence("counter")
			if !ok {
				return fail(errors.New("holding the lock without a fence"))
			}
			if err := s.Store(ctx, fmt.Sprintf("log/%06d", v+1), []byte(fmt.Sprintf("%d %d", os.Getpid(), fence))); err != nil {
				return fail(err)
			}
			if err := s.Store(ctx, "counter", []byte(strconv.Itoa(v+1))); err != nil {
				return fail(err)
			}
			if err := s.Unlock(ctx, "counter"); err != nil {
				return fail(err)
			}
		}
		return 0
	case "hold":
		if err := s.Lock(ctx, "held"); err != nil {
			return fail(err)
		}
		fence, _ := s.Fence("held")
		fmt.Printf("locked %d\n", fence)
		holdFor, _ := time.ParseDuration(os.Getenv(envHoldFor))
		if holdFor == 0 {
			<-ctx.Done() // until killed
			return 1
		}
		time.Sleep(holdFor)
		if err := s.Unlock(ctx, "held"); err != nil {
			return fail(err)
		}
		fmt.Println("released")
		return 0
	}
	return fail(fmt.Errorf("unknown helper mode %q", mode))
}

// helper is a running helper process.
type helper struct {
	cmd    *exec.Cmd
	lines  chan string
	exited chan error
	stderr *testproc.Output
}

func startHelper(t *testing.T, mode, dsn, table string, lease time.Duration, env ...string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envHelper+"="+mode, envDSN+"="+dsn, envTable+"="+table, envLease+"="+lease.String())
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	h := &helper{cmd: cmd, lines: make(chan string, 16), exited: make(chan error, 1), stderr: new(testproc.Output)}
	cmd.Stderr = h.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
		h.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("helper %s stderr:\n%s", mode, h.stderr.String())
		}
	})
	return h
}

// line waits (at most 60 s) for the helper's next output line.
func (h *helper) line(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-h.lines:
		if !ok {
			t.Fatalf("helper exited early: %v\n%s", <-h.exited, h.stderr)
		}
		return l
	case <-time.After(60 * time.Second):
		t.Fatal("helper printed nothing within 60s")
	}
	return ""
}

// wait waits (at most 60 s) for the helper to exit and returns its error.
func (h *helper) wait(t *testing.T) error {
	t.Helper()
	for range h.lines {
	}
	select {
	case err := <-h.exited:
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("helper did not exit within 60s")
	}
	return nil
}

// TestLockMutualExclusion has three processes increment one counter under
// the lock: no update may be lost, and the fences recorded by successive
// holders must increase.
func TestLockMutualExclusion(t *testing.T) {
	const procs, each = 3, 15
	dsn, table := sharedDSN(t, "mutex"), newTableName()
	var hs []*helper
	for range procs {
		hs = append(hs, startHelper(t, "increment", dsn, table, 2*time.Second, envCount+"="+strconv.Itoa(each)))
	}
	for _, h := range hs {
		if err := h.wait(t); err != nil {
			t.Fatalf("helper: %v\n%s", err, h.stderr)
		}
	}
	s := newStorage(t, dsn, table, DefaultLockLease)
	ctx := t.Context()
	if got := string(mustLoadPG(t, s, "counter")); got != strconv.Itoa(procs*each) {
		t.Fatalf("counter = %s after %d increments: updates were lost", got, procs*each)
	}
	logs, err := s.List(ctx, "log", false)
	if err != nil || len(logs) != procs*each {
		t.Fatalf("%d increments logged (%v), want %d", len(logs), err, procs*each)
	}
	last := int64(0)
	pids := map[string]bool{}
	for _, k := range logs {
		var pid string
		var fence int64
		if _, err := fmt.Sscanf(string(mustLoadPG(t, s, k)), "%s %d", &pid, &fence); err != nil {
			t.Fatal(err)
		}
		if fence <= last {
			t.Fatalf("%s: fence %d after %d: fences must increase with every holder", k, fence, last)
		}
		last = fence
		pids[pid] = true
	}
	if len(pids) != procs {
		t.Fatalf("increments came from %d processes, want %d", len(pids), procs)
	}
}

// TestLockKilledHolder: a foreign Unlock does not release a live holder's
// lock; once the holder is killed (SIGKILL, no cleanup), the lock expires
// after its lease and another process takes it with a larger fence.
func TestLockKilledHolder(t *testing.T) {
	const lease = 4 * time.Second
	dsn, table := sharedDSN(t, "killed"), newTableName()
	h := startHelper(t, "hold", dsn, table, lease)
	var fence int64
	if _, err := fmt.Sscanf(h.line(t), "locked %d", &fence); err != nil {
		t.Fatal(err)
	}
	s := newStorage(t, dsn, table, lease)
	ctx := t.Context()
	if err := s.Unlock(ctx, "held"); err == nil {
		t.Fatal("Unlock by a process that does not hold the lock succeeded")
	}
	if ok, err := s.TryLock(ctx, "held"); err != nil || ok {
		t.Fatalf("TryLock after a foreign Unlock = %v, %v: the lock was released by a non-owner", ok, err)
	}
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = h.wait(t)
	var live bool
	query(t, dsn, fmt.Sprintf("select expires > now() from %s_locks where name = 'held'", table), nil, &live)
	if !live {
		t.Fatal("the killed holder's lock was gone at once: it must stay until its lease expires")
	}
	lockCtx, cancel := context.WithTimeout(ctx, 10*lease)
	defer cancel()
	if err := s.Lock(lockCtx, "held"); err != nil {
		t.Fatalf("Lock after the holder died: %v", err)
	}
	got, ok := s.Fence("held")
	if !ok || got <= fence {
		t.Fatalf("fence %d (held %v) after the dead holder's %d: it must increase", got, ok, fence)
	}
	if err := s.Unlock(ctx, "held"); err != nil {
		t.Fatal(err)
	}
}

// TestLockLiveHolder: a holder that stays alive keeps its lock for four
// lease periods while another process keeps trying to take it, and then
// releases it normally (its Unlock would fail had the lock been lost).
func TestLockLiveHolder(t *testing.T) {
	const lease = time.Second
	dsn, table := sharedDSN(t, "live"), newTableName()
	h := startHelper(t, "hold", dsn, table, lease, envHoldFor+"="+(4*lease).String())
	if l := h.line(t); !strings.HasPrefix(l, "locked ") {
		t.Fatalf("helper said %q", l)
	}
	s := newStorage(t, dsn, table, lease)
	ctx := t.Context()
	attempts := 0
	for released := false; !released; {
		select {
		case l := <-h.lines:
			if l != "released" {
				t.Fatalf("helper said %q, want released", l)
			}
			released = true
		case <-time.After(200 * time.Millisecond):
			ok, err := s.TryLock(ctx, "held")
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				t.Fatalf("took the lock from a live holder after %d attempts", attempts)
			}
			attempts++
		}
	}
	if err := h.wait(t); err != nil {
		t.Fatalf("holder: %v\n%s", err, h.stderr)
	}
	if attempts < 8 {
		t.Fatalf("only %d attempts while the lock was held for 4 leases", attempts)
	}
	if ok, err := s.TryLock(ctx, "held"); err != nil || !ok {
		t.Fatalf("TryLock after release = %v, %v", ok, err)
	}
	if err := s.Unlock(ctx, "held"); err != nil {
		t.Fatal(err)
	}
}

func mustLoadPG(t *testing.T, s *Storage, k string) []byte {
	t.Helper()
	v, err := s.Load(t.Context(), k)
	if err != nil {
		t.Fatalf("Load(%q): %v", k, err)
	}
	return v
}

// TestCancelledLockHoldsNothing: a Lock whose context ends holds nothing
// afterwards — its statement runs to its end and a lock it took is given
// back — so the next owner does not wait out a lease nobody renews.
func TestCancelledLockHoldsNothing(t *testing.T) {
	dsn, table := sharedDSN(t, "cancel"), newTableName()
	s := newStorage(t, dsn, table, time.Minute)
	ctx := t.Context()
	if err := s.Lock(ctx, "warm"); err != nil { // the table is made
		t.Fatal(err)
	}
	for i := range 20 {
		cctx, cancel := context.WithCancel(ctx)
		go func() {
			time.Sleep(time.Duration(i*50) * time.Microsecond)
			cancel()
		}()
		if err := s.Lock(cctx, "raced"); err == nil {
			if err := s.Unlock(ctx, "raced"); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		if ok, err := s.TryLock(ctx, "raced"); err != nil || !ok {
			t.Fatalf("round %d: TryLock after a cancelled Lock = %v, %v (the lock was left held)", i, ok, err)
		}
		if err := s.Unlock(ctx, "raced"); err != nil {
			t.Fatal(err)
		}
	}
}
