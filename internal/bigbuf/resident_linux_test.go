package bigbuf

import (
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// residentPages counts the resident pages among the whole pages of the
// size bytes from b's start.
func residentPages(t *testing.T, b []byte, size int) (resident, total int) {
	page := uintptr(os.Getpagesize())
	base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	start := (base + page - 1) &^ (page - 1)
	end := (base + uintptr(size)) &^ (page - 1)
	region := unsafe.Slice(unsafe.SliceData(b), size)[start-base : end-base]
	vec := make([]byte, len(region)/int(page))
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, start, uintptr(len(region)), uintptr(unsafe.Pointer(unsafe.SliceData(vec)))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	for _, v := range vec {
		resident += int(v & 1)
	}
	return resident, len(vec)
}
