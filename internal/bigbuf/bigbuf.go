// Package bigbuf gathers large byte strings — the text of a large upstream
// message, the unescaped text of a large string for the policy — into one
// allocation whose memory the kernel makes resident at once.
//
// A buffer of a megabyte is a fresh large object, and its memory is often
// memory the Go runtime's scavenger gave back to the kernel after the last
// one died. Written byte after byte, each of its 256 pages then faults on
// first touch, and on a virtual machine whose kernel flushes the TLB on
// every entry (no PCID) each fault costs microseconds. Asking for all of
// its pages in one system call (MADV_POPULATE_WRITE, Linux 5.14) spares
// the faults, not the kernel's work of finding and zeroing the pages:
// gathering a megabyte from 32 KiB pieces took 3.9–4.2 ms into memory
// just given back and 2.5–2.6 ms populated, 0.23–0.80 ms and 0.15–0.27 ms
// as the collector and the scavenger ran between gatherings
// (BenchmarkGather, the 2-core development machine).
//
// Reusing the buffers would spare that work too (0.02–0.08 ms), and the
// collections their garbage causes, but what is gathered here reaches
// the policy, whose built-ins may keep what they are given (OPA caches
// compiled patterns and schemas by their text), so memory that held one
// call's data is never handed to another while anything may still point
// at it: only the garbage collector knows when nothing does.
//
// What the package gathers is read-only: a slice from Join aliases a
// string.
package bigbuf

import (
	"strings"
	"unsafe"
)

// Threshold is the size from which an allocation has its memory populated
// at once; a smaller one faults in a few pages at most.
const Threshold = 64 << 10

// Fill returns as a string the bytes fill writes at the start of dst, an
// allocation of n bytes (from Threshold on, populated at once); fill
// returns how many it wrote. dst is not zeroed: fill must write every byte
// it counts before reading it, and must not keep dst.
func Fill(n int, fill func(dst []byte) int) string {
	if n <= 0 {
		return ""
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteByte(0) // the buffer's address is the String's
	p := unsafe.StringData(b.String())
	if n >= Threshold {
		populate(unsafe.Slice(p, b.Cap()))
	}
	m := fill(unsafe.Slice(p, n))
	if m < 0 || m > n {
		panic("bigbuf: fill returned a length outside the room it was given")
	}
	return unsafe.String(p, m)
}

// Join returns the concatenation of parts in one allocation (read-only:
// it aliases a string), or nil when they are all empty.
func Join(parts ...[]byte) []byte {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if n == 0 {
		return nil
	}
	s := Fill(n, func(dst []byte) int {
		at := 0
		for _, p := range parts {
			at += copy(dst[at:], p)
		}
		return at
	})
	return unsafe.Slice(unsafe.StringData(s), len(s))
}
