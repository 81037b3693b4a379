package api

// Adversarial review: no secret reaches anyone who should not have it
// through what toolgate_api ANSWERS. The attacker here is another
// authenticated user: an approver of someone else's call, who reads the
// approval through GET /v1/approvals/{id} (viewApproval) and is meant to
// see its arguments only as data.toolgate.log.mask leaves them
// (policies/README.md: "Approvers see the arguments … masked …, so mask
// what approvers must not read").

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/modules/gateway"
)

// answerLeakApproval is alice's pending approval of a tools/call with args
// as they go upstream, bob its approver, built as approval.Manager.Resolve
// builds it (manager.go: ArgumentsSHA256 is the digest Call.Keys gives),
// and its contents with the arguments as the policy's mask left them.
func answerLeakApproval(args, masked string) (*approval.Approval, *approval.Contents) {
	call := approval.Call{Requester: "alice@example.com", Session: "ref-alice", Service: "bank",
		Method: "tools/call", Tool: "transfer", Arguments: []byte(args)}
	callKey, toolKey, digest := call.Keys()
	created := time.Now().UTC()
	a := &approval.Approval{ID: "a1b2c3d4e5f6", State: approval.StatePending, Stage: approval.StageRequest,
		Requester: call.Requester, Session: call.Session, Service: call.Service, Method: call.Method, Tool: call.Tool,
		ArgumentsSHA256: digest, DecisionID: "d1", Reason: "transfers need a second pair of eyes",
		Approvers: []string{"bob@example.com"}, Scopes: []string{approval.ScopeOnce},
		CreatedAt: created, ExpiresAt: created.Add(10 * time.Minute), CallKey: callKey, ToolKey: toolKey}
	return a, &approval.Contents{Arguments: json.RawMessage(args), Masked: json.RawMessage(masked)}
}

// answerLeakGet is what bob reads of the approval: the JSON getApproval
// answers him with.
func answerLeakGet(t *testing.T, a *approval.Approval, c *approval.Contents) (arguments, digest string, raw []byte) {
	t.Helper()
	bob := &gateway.Caller{User: "bob@example.com"}
	if !a.Visible(bob) || !a.MayDecide(bob) {
		t.Fatal("control: bob is not the approval's approver")
	}
	raw, err := json.Marshal(viewApproval(a, bob, "https://gateway.example.com", c))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Arguments json.RawMessage `json:"arguments"`
		Digest    string          `json:"arguments_sha256"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	return string(got.Arguments), got.Digest, raw
}

// Attack (fixed): alice's call carries a short secret the site's policy masks for
// approvers (data.toolgate.log.mask holds /arguments/pin): bob, the
// approver, gets {"pin":"[masked]", …} — and arguments_sha256, the
// unsalted SHA-256 of alice's unmasked arguments, canonical JSON, as they
// go upstream. Everything else of the arguments is in front of him, so he
// tries the 10,000 PINs offline (milliseconds) and finds the one whose
// digest matches: the mask protects nothing a guess can reach (PINs, short
// passwords, account numbers, dictionary words). The console's approval
// page shows the same digest ("Arguments digest").
// Fixed: neither the API's view nor the console's page carries the
// digest (the record and the audit log keep it).
func TestAnswerLeakAttackApprovalDigestUnmasksArguments(t *testing.T) {
	const pin = "4821"
	a, c := answerLeakApproval(`{"to":"DE44 5001 0517 5407 3249 31","amount":250,"pin":"`+pin+`"}`,
		`{"to":"DE44 5001 0517 5407 3249 31","amount":250,"pin":"[masked]"}`)
	arguments, digest, raw := answerLeakGet(t, a, c)
	// The PIN as a JSON string: its digits alone turn up in the answer's
	// timestamps now and then (…34.844821032Z).
	if strings.Contains(string(raw), `"`+pin+`"`) {
		t.Fatalf("control: the answer holds the PIN as it is: %s", raw)
	}
	recovered := ""
	for n := 0; n < 10000 && recovered == ""; n++ {
		guess := fmt.Sprintf("%04d", n)
		sum := sha256.Sum256(approval.Canonical([]byte(strings.Replace(arguments, `"[masked]"`, `"`+guess+`"`, 1))))
		if hex.EncodeToString(sum[:]) == digest {
			recovered = guess
		}
	}
	if recovered != "" {
		t.Errorf("the approver recovered the masked pin %q from arguments_sha256 %s of the answer:\n%s", recovered, digest, raw)
	}
}

// Holds: the approval's raw contents (Contents.Arguments, and a withheld
// result's Contents.Result) never reach the approver: viewApproval answers
// only what the mask left, and without contents (a listing) nothing of
// the arguments at all.
func TestAnswerLeakHoldsApprovalViewShowsMaskedContentsOnly(t *testing.T) {
	const secret = "pw-Hunter2-Correct-Horse-Battery"
	a, c := answerLeakApproval(`{"user":"alice","password":"`+secret+`"}`, `{"user":"alice","password":"[masked]"}`)
	c.Result = json.RawMessage(`{"content":[{"type":"text","text":"` + secret + `"}]}`)
	c.MaskedResult = json.RawMessage(`{"content":[{"type":"text","text":"[masked]"}]}`)
	if _, _, raw := answerLeakGet(t, a, c); strings.Contains(string(raw), secret) {
		t.Errorf("the approver's answer holds the raw contents: %s", raw)
	}
	if _, _, raw := answerLeakGet(t, a, nil); strings.Contains(string(raw), secret) || strings.Contains(string(raw), `"arguments"`) {
		t.Errorf("a listing's entry holds the arguments: %s", raw)
	}
}

// Attack (fixed): a result the result policy withheld for review, read by
// its requester through GET /v1/approvals/{id} before anyone decided: the
// requester is the runner's user, and the runner holds the same key, so
// the runner read what was withheld from it (masked, but whole but for
// the mask). Fixed: the withheld result is shown to those who may decide
// it only.
func TestAnswerLeakAttackRequesterReadsTheWithheldResult(t *testing.T) {
	const text = "the quarterly numbers before their release"
	a, c := answerLeakApproval(`{"report":"q3"}`, `{"report":"q3"}`)
	a.Stage = approval.StageResult
	c.Result = json.RawMessage(`{"content":[{"type":"text","text":"` + text + `"}]}`)
	c.MaskedResult = c.Result
	alice := &gateway.Caller{User: "alice@example.com"}
	if !a.Visible(alice) || a.MayDecide(alice) {
		t.Fatal("control: alice is the requester, not an approver")
	}
	raw, err := json.Marshal(viewApproval(a, alice, "https://gateway.example.com", c))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), text) {
		t.Errorf("the requester (and the runner with her key) reads the withheld result: %s", raw)
	}
	if _, _, raw := answerLeakGet(t, a, c); !strings.Contains(string(raw), text) {
		t.Errorf("control: the approver does not see the result to review: %s", raw)
	}
	a.RequesterMayApprove = true
	if raw, _ := json.Marshal(viewApproval(a, alice, "https://gateway.example.com", c)); !strings.Contains(string(raw), text) {
		t.Errorf("a requester who may approve does not see the result: %s", raw)
	}
}
