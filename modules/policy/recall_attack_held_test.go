package policy

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

const recallAttackSettings = `{"toolgate": {"settings": {
	"max_result_bytes": 300,
	"services": {
		"tracker": {"allow_without_approval": ["update_ticket"], "pin_arguments": {"create_ticket": {"project": "SEC"}}},
		"billing": {"review_results": true, "read_only": true, "max_result_bytes": 100},
		"mail": {"max_result_bytes": 5000}
	}
}}}`

type recallStep struct {
	flags      uint8
	tool, args string
	result     string
}

func TestRecallAttackHeldShippedSequences(t *testing.T) {
	engines := evaluatorPairs(t, shippedPolicies(t, map[string]string{"data.json": recallAttackSettings}))
	blob := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	results := []string{
		`{"content":[{"type":"text","text":"ok"}]}`,
		`{"content":[{"type":"text","text":"AKIAIOSFODNN7EXAMPLE"}]}`,
		`{"content":[{"type":"text","text":"o\u200bk"}]}`,
		`{"content":[{"type":"text","text":"` + strings.Repeat("a", 150) + `"}]}`,
		`{"content":[{"type":"text","text":"` + strings.Repeat("b", 400) + `"}]}`,
		`{"content":[{"type":"resource","resource":{"uri":"file:///x","blob":"` + blob("clean text") + `"}}]}`,
		`{"content":[{"type":"resource","resource":{"uri":"file:///x","blob":"` + blob("key AKIAIOSFODNN7EXAMPLE") + `"}}]}`,
		`{"content":[{"type":"resource","resource":{"uri":"file:///x","blob":"` + blob("o\u200bk") + `"}}]}`,
		`{"content":[{"type":"resource","resource":{"uri":"file:///x","blob":"!!notb64"}}]}`,
		`{"content":[{"type":"image","data":"aGk=","mimeType":"image/png"}]}`,
		`{"content":"not a list"}`,
		`{}`,
		`{"content":[{"type":"text","text":"ok"}],"structuredContent":{"t":"ghp_0123456789abcdefghijklmnopqrstuvwxyz01"}}`,
		`{"content":[{"type":"text","text":"ok"}],"isError":true}`,
		`{"content":[{"type":"text","text":"ok"}],"_meta":{"toolgate/decision":"x"}}`,
		`{"content":[{"type":"weird","text":"ok"}]}`,
		`{"content":[{"type":"text","text":"ok"}],"resultType":"input_required"}`,
		`{"resultType":"input_required","inputRequests":{"a":{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":{"type":"text","text":"AKIAIOSFODNN7EXAMPLE"}}]}}}}`,
		`{"content":[{"type":"text","text":"-----BEGIN PRIVATE KEY-----"},{"type":"text","text":"abc\n-----END PRIVATE KEY-----"}]}`,
		`{"content":[{"type":"text","text":"Bearer abcdefghijklmnopqrstuvwxyz0123456789"}]}`,
		`{"content":[{"type":"text","text":"ok","text\u200b":"x"}]}`,
	}
	var steps []recallStep
	for flags := range uint8(16) {
		for _, r := range results {
			steps = append(steps, recallStep{flags: flags, tool: "read_ticket", args: `{"ticket_id":"TEST-1"}`, result: r})
		}
	}
	ctx := context.Background()
	run := func(order []recallStep) {
		for _, s := range order {
			annotations := map[uint8]string{0: `{"readOnlyHint":true}`, 1: `{}`, 2: `{"destructiveHint":false}`, 3: `{"readOnlyHint":true,"destructiveHint":true}`}[s.flags&3]
			def := `{"name":` + string(mcpmsg.Quote(s.tool)) + `,"annotations":` + annotations + `,"inputSchema":{"type":"object"}}`
			call, err := callOf(def, s.args)
			if err != nil {
				t.Fatal(err)
			}
			if s.flags&4 != 0 {
				call.Service = &gateway.Service{ID: "billing", Tools: []string{s.tool}}
			} else if s.flags&8 != 0 {
				call.Service = &gateway.Service{ID: "mail", Tools: []string{s.tool}}
			}
			var got [2]string
			for i, e := range engines[stageRequest] {
				input, err := requestInput(call, toolTerm(call.Tool, call.Message.Name, call.Service), false)
				if err != nil {
					t.Fatal(err)
				}
				got[i] = decisionText(e.decide(ctx, input, time.Minute, "arguments"))
			}
			if got[0] != got[1] {
				t.Errorf("request %+v:\nplan    %s\ntopdown %s", s, got[0], got[1])
			}
			for i, e := range engines[stageResult] {
				h := &ResultHandler{Config{engine: e}}
				c := e.current.Load()
				input, err := h.input(c, call, subject{channel: channelResult, method: "tools/call", view: call}, []byte(s.result), map[*ast.Term]string{})
				if err != nil {
					got[i] = "input error"
					continue
				}
				got[i] = decisionText(e.decideWith(ctx, c, input, time.Minute, "result"))
			}
			if got[0] != got[1] {
				t.Errorf("result %+v:\nplan    %s\ntopdown %s", s, got[0], got[1])
			}
		}
	}
	run(steps)
	// Interleaved: each step after one far from it.
	var il []recallStep
	for i := 0; i < len(steps); i += 2 {
		il = append(il, steps[i], steps[(i*7+3)%len(steps)])
	}
	run(il)
	if engines[stageRequest][0].current.Load().program.Recalled() == 0 || engines[stageResult][0].current.Load().program.Recalled() == 0 {
		t.Error("no decision was recalled: the sequences test nothing of recall")
	}
	t.Logf("recalled: request %d, result %d", engines[stageRequest][0].current.Load().program.Recalled(), engines[stageResult][0].current.Load().program.Recalled())
}
