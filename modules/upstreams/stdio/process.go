//go:build unix

package stdio

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/toolgate/toolgate/internal/limitexec"
	"github.com/toolgate/toolgate/internal/mcpbridge"
)

// process is one running program: its stdin takes toolgate's messages, its
// stdout gives the server's, its stderr goes to the log.
type process struct {
	cmd     *exec.Cmd
	pid     int // also its process group's id
	spec    *spec
	stdin   *os.File
	stdout  *os.File
	stderr  *os.File
	logger  *zap.Logger
	secrets []string // redacted from what is logged
	// longest is the length of the longest secret: a line cut for the log
	// is redacted with that much more of it, so that no secret is cut in
	// two with its first part unredacted.
	longest int

	wmu  sync.Mutex    // one message written at a time
	done chan struct{} // closed once the process exited and was reaped

	stderrLines atomic.Int64 // lines read from stderr

	// stdoutLog bounds what its stdout puts in the log: lines that are not
	// JSON-RPC messages, and (through the link's MayLog) lines that begin
	// like one and do not parse and requests toolgate refuses to relay.
	// Used by the stdout reader only.
	stdoutLog logBudget

	mu         sync.Mutex
	why        string // why toolgate ended it, for runners ("" if it ended by itself)
	reason     string // the same for metrics
	stopping   bool   // toolgate is stopping it on purpose
	sigkilled  bool   // it needed SIGKILL after its grace period
	exitStatus string // how it ended, once reaped
}

// writeTimeout bounds writing one message when the request has no
// deadline: a program that stops reading its stdin is ended.
const writeTimeout = 30 * time.Second

// startProcess starts the program in a process group of its own, with the
// spec's environment (plus cred in CredEnv, whose log has cred and also
// redacted), working directory, user and
// limits, and nothing else of toolgate's: no environment, and no file
// descriptors but its three pipes.
func startProcess(s *spec, cred string, also []string, logger *zap.Logger) (*process, error) {
	path, err := lookPath(s.Command[0], s.Path)
	if err != nil {
		return nil, err
	}
	env := s.Env
	secrets := s.secrets
	if s.CredEnv != "" && cred != "" {
		env = append(append(make([]string, 0, len(env)+1), env...), s.CredEnv+"="+cred)
		secrets = append(append(append(make([]string, 0, len(secrets)+1+len(also)), secrets...), cred), also...)
	}
	var pipes [6]*os.File // child stdin, our stdin; our stdout, child stdout; our stderr, child stderr
	for i := 0; i < 6; i += 2 {
		if pipes[i], pipes[i+1], err = os.Pipe(); err != nil {
			closeAll(pipes[:])
			return nil, err
		}
	}
	childIn, ourIn, ourOut, childOut, ourErr, childErr := pipes[0], pipes[1], pipes[2], pipes[3], pipes[4], pipes[5]
	// The limits are set before the program's first instruction (see
	// internal/limitexec), so that nothing it forks escapes them.
	path, argv := limitexec.Command(path, s.Command, limitexec.Limits{Data: s.Limits.Memory,
		OpenFiles: int64(s.Limits.OpenFiles), Processes: int64(s.Limits.Processes)})
	cmd := &exec.Cmd{Path: path, Args: argv, Env: env, Dir: s.Dir,
		Stdin: childIn, Stdout: childOut, Stderr: childErr, SysProcAttr: sysProcAttr(s.user)}
	if err = closeOnExec(); err == nil {
		err = cmd.Start()
	}
	closeAll([]*os.File{childIn, childOut, childErr})
	if err != nil {
		closeAll([]*os.File{ourIn, ourOut, ourErr})
		return nil, err
	}
	p := &process{cmd: cmd, pid: cmd.Process.Pid, spec: s, stdin: ourIn, stdout: ourOut, stderr: ourErr,
		logger:  logger.With(zap.String("service", s.Service), zap.Int("pid", cmd.Process.Pid)),
		secrets: nonEmpty(secrets), done: make(chan struct{})}
	p.stdoutLog = logBudget{logger: p.logger, dropMsg: "program wrote more to its stdout than is logged (lines that are not JSON-RPC messages, malformed messages, requests toolgate refused)"}
	for _, secret := range secrets {
		p.longest = max(p.longest, encodedForms(len(secret)))
	}
	return p, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

// nonEmpty is secrets without the empty ones.
func nonEmpty(secrets []string) []string {
	var out []string
	for _, s := range secrets {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// serve reads the program's output until it exits, hands its messages to
// link, logs its stderr, reaps it and its process group, and calls ended
// with why it ended (safe to show runners) and a reason for metrics. The
// process counts in toolgate_stdio_processes from before its first message
// is read until before it is done: whoever waited for it to stop (stop,
// Destruct) finds it no longer counted.
func (p *process) serve(link *mcpbridge.Link, ended func(why, reason string)) {
	running := stdioMetrics.processes.WithLabelValues(p.spec.Service)
	running.Inc()
	var readers sync.WaitGroup
	readers.Go(func() {
		p.readMessages(link)
		go p.stdoutEnded()
	})
	readers.Go(p.readStderr)
	err := p.cmd.Wait()
	// Whatever the program left in its group (a node under npx) goes
	// with it.
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	p.stdin.Close()
	p.drain(&readers)
	p.mu.Lock()
	p.exitStatus = exitText(p.cmd.ProcessState, err)
	why, reason := p.why, p.reason
	if why == "" || exitedByItself(p.cmd.ProcessState) {
		why, reason = p.exitStatus, "exited"
	}
	p.mu.Unlock()
	running.Dec()
	close(p.done)
	p.logger.Info("program ended", zap.String("how", p.exitStatus))
	ended(why, reason)
}

// stdoutGrace is how long a program whose stdout ended may take to exit
// before it is ended.
const stdoutGrace = 2 * time.Second

// stdoutEnded ends the program if it is still running stdoutGrace after
// its stdout ended: a program that closed its stdout can answer nothing
// more, and running on it would leave its calls waiting out their
// deadlines and keep it from being restarted.
func (p *process) stdoutEnded() {
	t := time.NewTimer(stdoutGrace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.kill("stdout_closed", "closed its stdout while it was still running")
	}
}

// drainTimeout is how long the program's outputs are read after it and
// its process group are gone.
const drainTimeout = time.Second

// drain waits for the readers of the program's outputs to read them to
// their end, for at most drainTimeout: a process that left the program's
// group (setsid, as a detached child does) may hold them open, and must
// not keep the program from being restarted or stopped.
func (p *process) drain(readers *sync.WaitGroup) {
	done := make(chan struct{})
	go func() {
		readers.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-time.After(drainTimeout):
	}
	p.logger.Warn("a process that left the program's group keeps its output open; toolgate stops reading it")
	t := time.Now()
	_ = p.stdout.SetReadDeadline(t)
	_ = p.stderr.SetReadDeadline(t)
	<-done
}

// exitedByItself reports an exit with a status, rather than by a signal
// such as toolgate's SIGKILL.
func exitedByItself(ps *os.ProcessState) bool {
	if ps == nil {
		return false
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	return ok && ws.Exited()
}

// exitText says how a process ended: "exited with status 3", "was killed
// by SIGKILL".
func exitText(ps *os.ProcessState, err error) string {
	if ps == nil {
		return "ended (" + err.Error() + ")"
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	switch {
	case ok && ws.Signaled():
		return "was killed by " + unix.SignalName(ws.Signal())
	case ok && ws.Exited():
		return fmt.Sprintf("exited with status %d", ws.ExitStatus())
	}
	return "ended (" + ps.String() + ")"
}

// readMessages reads the program's stdout, one JSON-RPC message per line,
// each at most the gateway's max_response_size. A longer line is skipped,
// the request whose answer it begins told so (other people's calls may be
// in the program); one past maxSkipped times that ends the program. A line
// that is not JSON is logged and skipped.
func (p *process) readMessages(link *mcpbridge.Link) {
	defer p.stdout.Close()
	br := bufio.NewReaderSize(p.stdout, 64<<10)
	budget := &p.stdoutLog
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if int64(len(line)+len(chunk)) > p.spec.MaxMessage+2 { // +CR LF
			// The program goes on (other people's calls may be in it): the
			// line is skipped, and the request whose answer it begins gets
			// an error.
			skipped := int64(len(line) + len(chunk))
			line = append(line, chunk[:min(len(chunk), 4096)]...)
			p.tooLong(link, line)
			for errors.Is(err, bufio.ErrBufferFull) {
				chunk, err = br.ReadSlice('\n')
				if skipped += int64(len(chunk)); skipped > maxSkipped*p.spec.MaxMessage {
					// No end in sight: the program is broken.
					p.kill("line_too_long", "wrote a line longer than max_response_size ("+
						humanize.IBytes(uint64(p.spec.MaxMessage))+") to its stdout")
					_, _ = io.Copy(io.Discard, br) // until it is gone
					return
				}
			}
			line = line[:0]
			if err != nil {
				return
			}
			continue
		}
		line = append(line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if msg := bytes.TrimSpace(line); len(msg) > 0 {
			if msg[0] == '{' {
				link.Receive(bytes.Clone(msg))
			} else if budget.take() {
				p.logLine("program wrote a line that is not a JSON-RPC message to its stdout", msg)
			}
		}
		line = line[:0]
		if err != nil {
			return // the program closed stdout: it is ending
		}
	}
}

// maxSkipped bounds, in max_response_size, how long a line is skipped
// before the program is taken for broken and ended.
const maxSkipped = 4

// tooLong answers the request whose answer begins the overlong line, as
// far as its id can be read from that beginning, with an error.
func (p *process) tooLong(link *mcpbridge.Link, begin []byte) {
	why := "the program of service " + p.spec.Service + " wrote an answer longer than max_response_size (" +
		humanize.IBytes(uint64(p.spec.MaxMessage)) + "); it was not relayed"
	p.logger.Warn("program wrote a line longer than max_response_size to its stdout; it is skipped")
	link.FailAnswer(begin, why)
}

// maxLogLine bounds one line of a program's output in the log.
const maxLogLine = 2 << 10

// stderrBudget is how many lines of each of a process's outputs (stderr,
// and stdout lines that are not messages) it may log per stderrWindow;
// more are counted, not logged.
const (
	stderrBudget = 200
	stderrWindow = 10 * time.Second
)

// logBudget lets one output of a program log at most stderrBudget lines
// per stderrWindow; more are counted, and the count is logged.
type logBudget struct {
	logger          *zap.Logger
	dropMsg         string // logged with the count of lines dropped
	start           time.Time
	logged, dropped int
}

// take reports whether one more line may be logged.
func (b *logBudget) take() bool {
	if t := now(); t.Sub(b.start) >= stderrWindow {
		if b.dropped > 0 {
			b.logger.Warn(b.dropMsg, zap.Int("lines_dropped", b.dropped))
		}
		b.start, b.logged, b.dropped = t, 0, 0
	}
	if b.logged < stderrBudget {
		b.logged++
		return true
	}
	b.dropped++
	return false
}

// readStderr logs what the program writes to stderr, line by line, each
// line bounded and with the service's secrets redacted, at most
// stderrBudget lines per stderrWindow. A line is read up to maxLogLine and
// the longest secret beyond it, so that a secret that begins within what
// is logged is whole when it is redacted.
func (p *process) readStderr() {
	defer p.stderr.Close()
	br := bufio.NewReaderSize(p.stderr, maxLogLine+p.longest)
	budget := logBudget{logger: p.logger, dropMsg: "program wrote more to stderr than is logged"}
	for {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 {
			p.stderrLines.Add(1)
			if budget.take() {
				p.logLine("program stderr", bytes.TrimRight(chunk, "\r\n"))
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			// The rest of a long line is not logged.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
		}
		if err != nil {
			return
		}
	}
}

// logLine logs one line of the program's output, cut to maxLogLine and
// redacted. line must hold at least p.longest bytes past maxLogLine when
// there are that many, so that a secret that begins within what is logged
// is found whole.
func (p *process) logLine(msg string, line []byte) {
	p.logger.Info(msg, zap.String("line", redactLine(line, p.secrets, maxLogLine)))
}

// redactLine is line cut to its first cut bytes, with every part of it
// that belongs to an occurrence of a secret in line, and every word that
// holds one encoded (maskEncoded), replaced by "[redacted]". The cut is made in line's own bytes, where the secrets are
// found (cutting the redacted text instead would let a redaction pull the
// rest of a later copy of a secret into what is kept), and overlapping
// occurrences of several secrets are redacted as one.
func redactLine(line []byte, secrets []string, cut int) string {
	kept := line[:min(len(line), cut)]
	masked := make([]bool, len(kept))
	for _, s := range secrets {
		for from := 0; from < len(kept); {
			i := bytes.Index(line[from:], []byte(s))
			if i < 0 || from+i >= len(kept) {
				break
			}
			for k := from + i; k < min(from+i+len(s), len(kept)); k++ {
				masked[k] = true
			}
			from += i + 1
		}
	}
	maskEncoded(line, masked, secrets)
	var out strings.Builder
	for i := 0; i < len(kept); {
		j := i
		for j < len(kept) && masked[j] == masked[i] {
			j++
		}
		if masked[i] {
			out.WriteString("[redacted]")
		} else {
			out.Write(kept[i:j])
		}
		i = j
	}
	if len(line) > cut {
		out.WriteString(" […]")
	}
	return out.String()
}

// send writes one message to the program's stdin, on one line.
func (p *process) send(ctx context.Context, msg []byte) error {
	line := append(mcpbridge.OneLine(msg)[:len(msg):len(msg)], '\n')
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = now().Add(writeTimeout)
	}
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_ = p.stdin.SetWriteDeadline(deadline)
	_, err := p.stdin.Write(line)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Part of the message may be written: nothing after it can be read.
		p.kill("stopped_reading", "stopped reading its input")
		return errors.New("the program stopped reading its input")
	}
	return fmt.Errorf("the program's input is closed: %w", err)
}

// kill ends the process group at once; why is told to runners.
func (p *process) kill(reason, why string) {
	p.mu.Lock()
	if p.why == "" && !p.stopping {
		p.why, p.reason = why, reason
	}
	p.mu.Unlock()
	select {
	case <-p.done:
		return // reaped: its id may belong to someone else now
	default:
	}
	p.logger.Warn("ending the program", zap.String("reason", why))
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
}

// stop ends the process the way MCP's stdio transport describes: its
// stdin is closed and its process group gets SIGTERM; after grace, SIGKILL.
// It returns once the process is reaped.
func (p *process) stop(grace time.Duration) {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	select {
	case <-p.done:
		return
	default:
	}
	p.stdin.Close()
	_ = syscall.Kill(-p.pid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return
	case <-t.C:
	}
	p.mu.Lock()
	p.sigkilled = true
	p.mu.Unlock()
	p.logger.Warn("program did not stop within its grace period; killing it", zap.Duration("stop_timeout", grace))
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	<-p.done
}
