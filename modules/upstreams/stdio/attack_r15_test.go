package stdio

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/toolgate/toolgate/internal/mcpbridge/bridgetest"
	"github.com/toolgate/toolgate/internal/stdioserver"
	"github.com/toolgate/toolgate/modules/gateway"
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

// Attack (a broken program, or one a runner's call breaks): the program
// closes its stdout and goes on running. Nothing it does can reach
// toolgate any more, yet toolgate waited for the process to exit before
// it took the program for ended: the call in progress waited out its
// whole deadline, every later call too, and the program was never
// restarted — while calls kept coming it never even went idle, so the
// service stayed dead for everyone who shares it. Expected: a program
// whose stdout ended is ended (within a grace for one that is exiting),
// its call in progress gets a retryable error, and it is restarted.
func TestR15ProgramThatClosesStdoutIsEnded(t *testing.T) {
	s := testSpec(t, "")
	s.Env = []string{"PATH=" + defaultPath, envFixReview + "=mute"}
	rt := start(t, s, nil)
	alice := &bridgetest.Runner{T: t, RT: rt.bridge, User: "alice"}
	if res := alice.Initialize(bridgetest.Sampling); !gjson.Get(res, "result.protocolVersion").Exists() {
		t.Fatalf("initialize: %s", res)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	answer := make(chan []string, 1)
	go func() {
		resp := alice.SendCtx(ctx, http.MethodPost, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{}}}`)
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		answer <- bridgetest.Messages(resp, data)
	}()
	msgs := <-answer
	if ctx.Err() != nil {
		t.Fatalf("the call waited out its deadline: the program that closed its stdout was never taken for ended")
	}
	if len(msgs) == 0 || !gjson.Get(msgs[len(msgs)-1], "error.data.retryable").Bool() {
		t.Fatalf("the call: %q, want a retryable error", msgs)
	}
	waitFor(t, "a restart is scheduled", func() bool { return len(rt.schedule()) == 1 })
	if got := rt.schedule()[0].Reason; got != "stdout_closed" {
		t.Errorf("restart reason %q, want stdout_closed", got)
	}
}

// Attack (a program that prints its configuration, as many do when they
// fail): an env value of several lines — a PEM private key, a service
// account's JSON — is a secret redacted where it occurs whole, but the
// program's output is logged line by line, and no line holds the whole
// value: each line of the key reached the log in clear. Expected: every
// line of such a value that is a secret's length (8 bytes or more) is
// redacted like one.
func TestR15MultiLineEnvValueIsRedactedLineByLine(t *testing.T) {
	const body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj"
	const key = "-----BEGIN PRIVATE KEY-----\n" + body + "\r\nMzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu\n-----END PRIVATE KEY-----\n"
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tr := &Transport{Command: []string{exe, "-test.run=^$"}, Env: map[string]string{"SERVICE_KEY": key, stdioserver.EnvMode: stdioserver.ModeServe}}
	s, err := tr.spec(&gateway.Service{ID: "svc"}, "Authorization")
	if err != nil {
		t.Fatal(err)
	}
	s.Idle, s.Stop, s.MaxProcs, s.StartTimeout, s.MaxMessage, s.Depth = time.Minute, 5*time.Second, 10, 30*time.Second, 1<<20, 64
	core, logs := observer.New(zap.InfoLevel)
	rt := start(t, s, zap.New(core))
	alice := runnerOf(t, rt, "alice")
	for i, stream := range []string{"stderr", "stdout"} {
		args := fmt.Sprintf(`{"text":%q,"count":1,"stdout":%v}`, "config: SERVICE_KEY="+key+"end of config", stream == "stdout")
		if res := callTool(alice, i+1, "shout", args); bridgetest.ToolText(res) != "shouted" {
			t.Fatalf("shout: %s", res)
		}
	}
	waitFor(t, "the last line is logged from both outputs", func() bool {
		return logs.Filter(func(e observer.LoggedEntry) bool {
			line, _ := e.ContextMap()["line"].(string)
			return strings.Contains(line, "end of config")
		}).Len() == 2
	})
	for _, e := range logs.All() {
		line, _ := e.ContextMap()["line"].(string)
		if strings.Contains(line, body[:24]) || strings.Contains(line, "MzEfYyjiWA4R4") {
			t.Errorf("%q: a line of the env value reached the log: %s", e.Message, line)
		}
	}
}
