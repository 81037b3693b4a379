package policy

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap"
)

func TestZZPhases(t *testing.T) {
	b := &testing.B{}
	_ = b
	h := &ResultHandler{Config{Timeout: caddy.Duration(benchTimeout), engine: benchEngine(t, "data.toolgate.result.decision", stageResult), audit: benchAudit(), logger: zap.NewNop()}}
	call := benchCall(t, benchTool, `{"ticket_id":"TEST-123"}`)
	if _, err := recordRequestInput(call, toolTerm(call.ToolDefinition(), call.Message.Name, call.Service)); err != nil {
		t.Fatal(err)
	}
	payload := []byte(benchSmallResult)
	ctx := context.Background()
	s := subject{channel: channelResult, method: "tools/call", view: call}
	evict := make([]byte, evictSize)
	const n = 2000
	names := []string{"terms", "complete", "decide", "write", "record"}
	d := make([][]time.Duration, len(names))
	for _, cold := range []bool{false, true} {
		for i := range d { d[i] = d[i][:0] }
		for range n {
			if cold { evictCaches(evict) }
			c := h.engine.current.Load()
			t0 := time.Now()
			spans := map[*ast.Term]string{}
			res, scan, err := resultTerms(payload, shapeOf(s.channel, s.method), c.scanner, spans)
			if err != nil { t.Fatal(err) }
			t1 := time.Now()
			in, err := s.complete(call, ast.Item(keyChannel, channelTerm(s.channel)), ast.Item(keyResult, res), ast.Item(keyScan, scan))
			if err != nil { t.Fatal(err) }
			t2 := time.Now()
			o := h.engine.decideWith(ctx, c, in, time.Second, "result")
			t3 := time.Now()
			_, err = s.write(payload, in, o, "abc", spans)
			t4 := time.Now()
			h.newDecisionWithID(ctx, "abc", call, o, stageResult, payload, nil, in, s.channel)
			t5 := time.Now()
			for i, x := range []time.Duration{t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), t4.Sub(t3), t5.Sub(t4)} { d[i] = append(d[i], x) }
		}
		for i, name := range names {
			slices.Sort(d[i])
			fmt.Printf("cold=%v %-9s p50 %6.1fµs p90 %6.1fµs\n", cold, name, float64(d[i][n/2].Nanoseconds())/1e3, float64(d[i][n*9/10].Nanoseconds())/1e3)
		}
	}
}
