package policy

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// regexBuiltins are OPA's regular expression built-ins the shipped
// policies call.
var regexBuiltins = []string{
	"regex.match", "regex.split", "regex.find_n", "regex.find_all_string_submatch_n",
	"regex.replace", "regex.is_valid", "regex.template_match", "regex.globs_match",
}

// countRegexWork has the regular expression built-ins count the bytes of
// the strings they are given, for as long as the test runs; the engines
// must be built after it, since a plan binds its built-ins when compiled.
func countRegexWork(t *testing.T) *int {
	t.Helper()
	n := new(int)
	for _, name := range regexBuiltins {
		orig := topdown.GetBuiltin(name)
		if orig == nil {
			continue
		}
		topdown.RegisterBuiltinFunc(name, func(bctx topdown.BuiltinContext, ops []*ast.Term, iter func(*ast.Term) error) error {
			for _, op := range ops {
				if s, ok := op.Value.(ast.String); ok {
					*n += len(s)
				}
			}
			return orig(bctx, ops, iter)
		})
		t.Cleanup(func() { topdown.RegisterBuiltinFunc(name, orig) })
	}
	return n
}

// TestResultPolicyRegexWorkIsBounded: a large result that holds nothing
// to redact is not run through a regular expression whole. The gateway's
// scan (scan.go) finds that it holds nothing; the policy's rules must
// guard each regular expression they run on an item's text with what
// makes it cheap (a contains, a prefix), since Go's regular expressions
// without a literal prefix read text at tens of MB/s: one unguarded
// regex.match over every text item once made the result stage of a 1 MiB
// log ten times slower (2 ms to 25 ms). This counts the work, not the
// time, so it fails on any machine.
func TestResultPolicyRegexWorkIsBounded(t *testing.T) {
	work := countRegexWork(t)
	h := &ResultHandler{Config{
		Timeout: caddy.Duration(benchTimeout),
		engine:  benchEngine(t, "data.toolgate.result.decision", stageResult),
		audit:   benchAudit(),
		logger:  zap.NewNop(),
	}}
	passing := passingHandler(t)
	log := logText(1 << 20)
	third := logText(300 << 10)
	blob := base64.StdEncoding.EncodeToString([]byte(third))
	for _, c := range []struct {
		name, result string
		h            *ResultHandler
	}{
		{"one text item, cut to fit", textResult(log), h},
		{"one text item, let through", textResult(bigText(1 << 20)), passing},
		{"three text items", `{"content":[` + textItem(third) + `,` + textItem(third) + `,` + textItem(third) + `],"isError":false}`, h},
		{"text resource", `{"content":[{"type":"resource","resource":{"uri":"file:///log","mimeType":"text/plain","text":` +
			textJSON(third) + `}}],"isError":false}`, h},
		{"text items with a marker at their seam", `{"content":[` + textItem(third+" Bearer") + `,` + textItem(" of news. "+third) + `],"isError":false}`, h},
		{"text outside ASCII", textResult(strings.ReplaceAll(log, "room", "salle n°")), h},
		{"blob of text", `{"content":[{"type":"resource","resource":{"uri":"file:///log","blob":"` + blob + `"}}],"isError":false}`, passing},
	} {
		t.Run(c.name, func(t *testing.T) {
			call := benchCall(t, benchTool, `{"ticket_id":"TEST-123"}`)
			*work = 0
			out, err := c.h.check(context.Background(), call, []byte(c.result), "")
			if err != nil || out == nil {
				t.Fatalf("check: %v", err)
			}
			if strings.Contains(string(out.Bytes()), "withheld") {
				t.Fatalf("withheld: %.300s", out.Bytes())
			}
			// A rule may look at a line, a seam, an item's head: kilobytes.
			if *work > 64<<10 {
				t.Errorf("regular expressions read %d bytes of a %d-byte result that holds nothing to redact", *work, len(c.result))
			}
			t.Logf("regular expressions read %d bytes", *work)
		})
	}
}

// textItem is a text content item of text.
func textItem(text string) string { return `{"type":"text","text":` + textJSON(text) + `}` }

func textJSON(s string) string { return string(mcpmsg.Quote(s)) }
