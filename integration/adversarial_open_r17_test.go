//go:build open_findings

package integration

import (
	"fmt"
	"net/http"
	"testing"
)

// Attack (open): the loop of TestR17DeniedApprovalsKeepTheirContents with
// approvals approved for once and used at once by their own requester (the
// default lets them): a used approval keeps its sealed arguments (and a
// released result) for its page until its record is removed, a day after
// the decision, so a runner grows the storage by up to twice
// max_request_size per ask, for a day, at its pace (each cycle runs the
// call upstream once).
//
// Expected: README, Approvals: "each keeps the call's arguments (and a
// withheld result), encrypted, until it is decided or expires".
//
// Reproduced: 12 asks of 256 KiB, each approved and used, left 8 MiB.
//
// Why open: keeping a used approval's arguments for its page is relied on
// (TestReplicas2HoldsWithheldResultReleasedOnceAcrossReplicas checks the
// page of a released result still shows it). The fix I would make: drop
// the contents when an approval is used up (Store.Consume keeping a copy
// for the caller that releases a withheld result, which deletes them once
// opened), the page then saying the arguments are gone with the call, as
// for an expired one; or count a requester's decided approvals that still
// hold contents against max_pending_per_user.
//
// Severity: medium.
func TestR17UsedApprovalsKeepTheirContents(t *testing.T) {
	_, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	const cycles, argBytes = 12, 256 << 10
	for i := range cycles {
		text := exFiller(fmt.Sprintf("r17-used-%d-", i), argBytes)
		p := mustPend(t, m.call(100+i, "gated_tool", fmt.Sprintf(`{"text":%q}`, text)))
		if r := g.api(t, http.MethodPost, "/v1/approvals/"+p.ApprovalID+"/approve", aliceKey, []byte(`{"scope":"once"}`)); r.StatusCode != http.StatusOK {
			t.Fatalf("approve %d: %d %s", i, r.StatusCode, r.Body)
		}
		mustSucceed(t, m.call(200+i, "gated_tool", fmt.Sprintf(`{"text":%q}`, text)))
	}
	if size := approvalContentsBytes(g); size > argBytes {
		t.Errorf("%d approvals approved once and used keep %d KiB of sealed contents", cycles, size>>10)
	}
}
