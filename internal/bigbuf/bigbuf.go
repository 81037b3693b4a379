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
// What a Builder gathers is read-only: its Bytes alias the String.
package bigbuf

import (
	"strings"
	"unicode/utf8"
	"unsafe"
)

// Threshold is the size from which a Builder has its memory populated at
// once; a smaller buffer faults in a few pages at most.
const Threshold = 64 << 10

// Builder gathers bytes into one allocation of the size Grow announced.
// The zero value is an empty Builder; like strings.Builder it must not be
// copied after use.
type Builder struct {
	b        strings.Builder
	populate bool // the next write populates the memory first
}

// Grow makes room for n more bytes; call it once, before writing, with the
// final size. From Threshold on, the first write populates the memory.
func (b *Builder) Grow(n int) {
	b.b.Grow(n)
	b.populate = b.b.Len() == 0 && n >= Threshold
}

// first writes the first byte c and populates the rest of the memory.
func (b *Builder) first(c byte) {
	b.populate = false
	b.b.WriteByte(c)
	s := b.b.String()
	populate(unsafe.Slice(unsafe.StringData(s), b.b.Cap()))
}

// Write appends p.
func (b *Builder) Write(p []byte) {
	if b.populate && len(p) > 0 {
		b.first(p[0])
		p = p[1:]
	}
	b.b.Write(p)
}

// WriteString appends s.
func (b *Builder) WriteString(s string) {
	if b.populate && len(s) > 0 {
		b.first(s[0])
		s = s[1:]
	}
	b.b.WriteString(s)
}

// WriteByte appends c; it never fails.
func (b *Builder) WriteByte(c byte) error {
	if b.populate {
		b.first(c)
		return nil
	}
	return b.b.WriteByte(c)
}

// WriteRune appends r's UTF-8 encoding.
func (b *Builder) WriteRune(r rune) {
	if b.populate {
		var e [utf8.UTFMax]byte
		b.Write(utf8.AppendRune(e[:0], r))
		return
	}
	b.b.WriteRune(r)
}

// Len is the number of bytes written.
func (b *Builder) Len() int { return b.b.Len() }

// String returns what was written.
func (b *Builder) String() string { return b.b.String() }

// Bytes returns what was written, as the String's bytes: they must never be
// modified.
func (b *Builder) Bytes() []byte {
	s := b.b.String()
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// Join returns the concatenation of parts in one allocation (read-only, as
// Bytes), or nil when they are all empty.
func Join(parts ...[]byte) []byte {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if n == 0 {
		return nil
	}
	var b Builder
	b.Grow(n)
	for _, p := range parts {
		b.Write(p)
	}
	return b.Bytes()
}
