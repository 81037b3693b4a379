// Package testproc holds what tests need to run peer processes (Vault,
// PostgreSQL, helper copies of the test binary): a free loopback port and
// a buffer that collects a process's output while tests read it.
package testproc

import (
	"bytes"
	"net"
	"sync"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Output collects a process's output; it is safe for concurrent writers
// and readers.
type Output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

// String returns everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// Tail returns at most the last n bytes written.
func (o *Output) Tail(n int) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	b := o.buf.Bytes()
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
