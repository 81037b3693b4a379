package gateway

import (
	"errors"
	"testing"
)

// Room for request bodies is held per caller and in all, given back by
// Shrink and Release (once, however often they are called), and a refusal
// holds nothing and names the option.
func TestHoldRequestBytes(t *testing.T) {
	a := &App{MaxRequestBytesInFlight: 100, MaxRequestBytesInFlightPerCaller: 60}
	held := func(user string) int64 {
		heldRequestBytes.Lock()
		defer heldRequestBytes.Unlock()
		return heldRequestBytes.byUser[user]
	}
	refused := func(err error, option string) bool {
		var limit *RequestBytesLimitError
		return errors.As(err, &limit) && limit.Option == option
	}
	x, err := a.HoldRequestBytes("x", 50)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.HoldRequestBytes("x", 11); !refused(err, "max_request_bytes_in_flight_per_caller") || held("x") != 50 {
		t.Fatalf("past the caller's room: %v, %d held", err, held("x"))
	}
	y, err := a.HoldRequestBytes("y", 50)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.HoldRequestBytes("z", 1); !refused(err, "max_request_bytes_in_flight") || held("z") != 0 {
		t.Fatalf("past the gateway's room: %v, %d held", err, held("z"))
	}
	x.Shrink(10)
	x.Shrink(30) // never grows back
	if held("x") != 10 {
		t.Fatalf("after Shrink(10): %d held", held("x"))
	}
	z, err := a.HoldRequestBytes("z", 40)
	if err != nil {
		t.Fatalf("with the room x gave back: %v", err)
	}
	for _, b := range []*RequestBytes{x, x, y, z, nil} {
		b.Release()
	}
	heldRequestBytes.Lock()
	defer heldRequestBytes.Unlock()
	if heldRequestBytes.all != 0 || len(heldRequestBytes.byUser) != 0 {
		t.Fatalf("after every release: %d held, %v", heldRequestBytes.all, heldRequestBytes.byUser)
	}
}
