package stdio

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/stdioserver"
)

// Attack (a broken program, or a runner that makes one answer too much —
// 300 KiB of "<", which the SDK writes as 1.8 MiB of \u003c):
// an answer longer than max_response_size, but not so long that the
// program is taken for broken, is skipped, and the call it answers gets
// toolgate's own retryable error (process.tooLong). That error was handed
// to the link as if the program had sent it, so the link recoded it as an
// upstream's use of toolgate's own code: the runner got -32603 "the
// upstream answered with error code -32011, which is toolgate's own",
// without retryable — toolgate's own answer shown as the program's.
// Expected: toolgate's error as it wrote it, retryable.
func TestR15OverlongAnswerIsToolgatesOwnError(t *testing.T) {
	rt := start(t, testSpec(t, stdioserver.ModeServe), nil)
	alice := runnerOf(t, rt, "alice")
	msg := callTool(alice, 1, "echo", `{"text":"`+strings.Repeat("<", 300<<10)+`"}`)
	if gjson.Get(msg, "error.code").Int() != -32011 || !gjson.Get(msg, "error.data.retryable").Bool() ||
		!strings.Contains(gjson.Get(msg, "error.message").String(), "wrote an answer longer than max_response_size") {
		t.Fatalf("the overlong answer: %.300s", msg)
	}
	if msg := callTool(alice, 2, "echo", `{"text":"after"}`); !strings.Contains(msg, "after") {
		t.Fatalf("the next call: %.300s", msg)
	}
}
