package bigbuf

import (
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// unsupported is set once the kernel refused MADV_POPULATE_WRITE (before
// Linux 5.14): the pages then fault in as they are written, as without it.
var unsupported atomic.Bool

// populate makes the whole pages of b resident and writable.
func populate(b []byte) {
	if unsupported.Load() {
		return
	}
	page := uintptr(os.Getpagesize())
	base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	start := (base + page - 1) &^ (page - 1)
	end := (base + uintptr(len(b))) &^ (page - 1)
	if end <= start {
		return
	}
	region := b[start-base : end-base]
	if err := unix.Madvise(region, unix.MADV_POPULATE_WRITE); err == unix.EINVAL || err == unix.ENOSYS {
		unsupported.Store(true)
	}
}
