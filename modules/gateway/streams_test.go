package gateway

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Room for request bodies is held per caller and in all, given back by
// Shrink and Release (once, however often they are called), and a refusal
// holds nothing, names the option and is counted under it; the gauge
// shows what is held.
func TestHoldRequestBytes(t *testing.T) {
	refusals := func(option string) float64 {
		return testutil.ToFloat64(limitMetrics.refusals.WithLabelValues(option))
	}
	perCaller, inAll := refusals("max_request_bytes_in_flight_per_caller"), refusals("max_request_bytes_in_flight")
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
	if got := testutil.ToFloat64(limitMetrics.requestBytes); got != 100 {
		t.Errorf("toolgate_request_bytes_in_flight = %v with 100 bytes held", got)
	}
	if a, b := refusals("max_request_bytes_in_flight_per_caller")-perCaller, refusals("max_request_bytes_in_flight")-inAll; a != 1 || b != 1 {
		t.Errorf("refusals counted: %v per caller, %v in all; want 1 each", a, b)
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

// Streams are counted per caller and in all until their done function runs
// (once, however often it is called); a refusal counts nothing, names the
// option and is counted under it; the gauge shows the streams open.
func TestOpenStream(t *testing.T) {
	a := &App{MaxStreams: 3, MaxStreamsPerCaller: 2}
	refusals := func(option string) float64 {
		return testutil.ToFloat64(limitMetrics.refusals.WithLabelValues(option))
	}
	perCaller, inAll := refusals("max_streams_per_caller"), refusals("max_streams")
	var done []func()
	open := func(user string) error {
		d, err := a.OpenStream(user)
		if err == nil {
			done = append(done, d)
		}
		return err
	}
	refused := func(err error, option string) bool {
		var limit *StreamLimitError
		return errors.As(err, &limit) && limit.Option == option
	}
	for _, user := range []string{"x", "x", "y"} {
		if err := open(user); err != nil {
			t.Fatal(err)
		}
	}
	if err := open("y"); !refused(err, "max_streams") {
		t.Fatalf("past max_streams: %v", err)
	}
	done[2]()
	done[2]()
	if err := open("x"); !refused(err, "max_streams_per_caller") {
		t.Fatalf("past max_streams_per_caller: %v", err)
	}
	if got := testutil.ToFloat64(limitMetrics.streams); got != 2 {
		t.Errorf("toolgate_streams_open = %v with 2 streams open", got)
	}
	if a, b := refusals("max_streams_per_caller")-perCaller, refusals("max_streams")-inAll; a != 1 || b != 1 {
		t.Errorf("refusals counted: %v per caller, %v in all; want 1 each", a, b)
	}
	done[0]()
	done[1]()
	if got := testutil.ToFloat64(limitMetrics.streams); got != 0 {
		t.Errorf("toolgate_streams_open = %v after every stream ended", got)
	}
}
