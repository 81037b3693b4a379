package testproc

import (
	"net"
	"strconv"
	"sync"
	"testing"
)

func TestFreePort(t *testing.T) {
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("port %d is not free: %v", port, err)
	}
	l.Close()
}

func TestOutput(t *testing.T) {
	var o Output
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				o.Write([]byte("0123456789"))
				_ = o.Tail(5)
			}
		})
	}
	wg.Wait()
	if got := len(o.String()); got != 8000 {
		t.Fatalf("%d bytes collected, want 8000", got)
	}
	if got := o.Tail(4); got != "6789" {
		t.Fatalf("Tail(4) = %q", got)
	}
	if got := o.Tail(1 << 20); len(got) != 8000 {
		t.Fatalf("Tail beyond the length: %d bytes", len(got))
	}
}
