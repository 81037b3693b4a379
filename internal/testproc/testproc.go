// Package testproc holds what tests need to run peer processes (Vault,
// PostgreSQL, helper copies of the test binary): a free loopback port and
// a buffer that collects a process's output while tests read it; and to
// measure memory: the peak heap of a function, and deep documents.
package testproc

import (
	"bytes"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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

// PeakHeap runs f and returns the most the heap grew above where it stood
// before f, sampled every millisecond while f runs (so a peak shorter than
// that may be missed, never invented).
func PeakHeap(f func()) uint64 {
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var high atomic.Uint64
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		var m runtime.MemStats
		for {
			select {
			case <-done:
				return
			default:
			}
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > high.Load() {
				high.Store(m.HeapAlloc)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	f()
	close(done)
	<-stopped
	if h := high.Load(); h > base.HeapAlloc {
		return h - base.HeapAlloc
	}
	return 0
}

// DeepJSON is a JSON array nested depth deep, each level holding width
// zeros before the next, with the string "s" at the bottom: a document
// small in bytes whose every node has a long path.
func DeepJSON(depth, width int) string {
	var b strings.Builder
	for range depth {
		b.WriteString("[" + strings.Repeat("0,", width))
	}
	b.WriteString(`"s"`)
	b.WriteString(strings.Repeat("]", depth))
	return b.String()
}
