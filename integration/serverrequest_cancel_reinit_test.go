package integration

import (
	"testing"
	"time"
)

// Attack (fixed): the runner's notifications/cancelled of a request on its
// way while toolgate re-initializes the upstream session overtook the
// request. The request recorded that it went to S1; S1 answered 404 and
// post re-initialized (a slow initialize). The runner cancelled meanwhile:
// the record named S1, still current, so the cancellation took the
// ordinary path, got 404 from S1 too and waited on the same
// re-initialization; once S2 existed it was sent at once, while the
// request's own re-initialization first listed S2's tools. S2 got the
// cancellation of a request it never heard of (ignored), then the call,
// which ran unstopped though the runner had cancelled it.
// Fixed: the cancellation goes to the session its request's record names;
// finding it gone (404), it marks the request, still recorded there,
// cancelled (mcpsession CancelGone), and the request is not sent to the
// session replacing it (SendingIn): it never runs, and the runner's call
// is answered so (mcpproxy cancelInProgress).
//
// Over SSE and with JSON answers (cancelAttackRun, cancelAttackJudge): the
// call never reaches an upstream session, and the runner is told it did
// not run.
func TestRunnersCancellationDuringItsRequestsReinitializeIsNotOvertaken(t *testing.T) {
	for i, kind := range upstreamKinds {
		t.Run(kind.name, func(t *testing.T) {
			out := cancelAttackRun(t, i, "initialize", 1500*time.Millisecond, "cr-stop-7-"+kind.name)
			cancelAttackJudge(t, out)
			for _, s := range out.order {
				if s == "call" {
					t.Errorf("the call reached an upstream session though the runner cancelled it during the re-initialization: %v", out.order)
				}
			}
		})
	}
}
