package policy

import (
	"context"
	"encoding/base64"
	"fmt"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/modules/gateway"
)

// The gateway's scan and the policy's long way decide the same for blobs
// in every place a blob can be, with the mimeTypes of the fifth look
// (TestScanReadsMimeTypesAsThePolicy covers three places).
func TestR5Review2ScanReadsBlobsAsThePolicyEverywhere(t *testing.T) {
	c, call, h := shippedScanFixture(t)
	mimes := []string{``, `"mimeType":null,`, `"mimeType":0,`, `"mimeType":"text/plain; charset=utf-16",`, `"mimeType":"text/plain",`, `"mimeType":"image/png",`}
	blob := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	blobs := []string{blob("plain"), blob("a\u200bb"), blob("\xff\xfek\x00"), blob("k\x00e\x00y\x00")}
	res := `{"type":"resource","resource":{"uri":"b",%s"blob":"%s"}}`
	kinds := []struct{ channel, method, payload string }{
		{channelResult, "tools/call", `{"resultType":"input_required","content":[` + res + `],"inputRequests":{}}`},
		{channelResult, "resources/read", `{"resultType":"input_required","contents":[{"uri":"b",%s"blob":"%s"}],"inputRequests":{}}`},
		{channelResult, "prompts/get", `{"resultType":"input_required","messages":[{"role":"user","content":` + res + `}],"inputRequests":{}}`},
		{channelResult, "tools/call", `{"content":[{"type":"text","text":"x"}],"resultType":"input_required","inputRequests":{"s":{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":` + res + `}]}}}}`},
		{channelResult, "tools/call", `{"content":[{"type":"text","text":"x"}],"resultType":"input_required","inputRequests":{"s":{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":[` + res + `]}]}}}}`},
		{channelResult, "resources/read", `{"resultType":"input_required","inputRequests":{"s":{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":` + res + `}]}}}}`},
		{gateway.ChannelServerRequest, "sampling/createMessage", `{"messages":[{"role":"user","content":` + res + `}],"maxTokens":5}`},
		{gateway.ChannelServerRequest, "sampling/createMessage", `{"messages":[{"role":"user","content":[` + res + `]}],"maxTokens":5}`},
		{channelResult, "prompts/get", `{"messages":[{"role":"user","content":[` + res + `]}]}`},
		{channelResult, "tasks/result", `{"content":[` + res + `]}`},
	}
	ctx := context.Background()
	for _, k := range kinds {
		for _, m := range mimes {
			for _, b := range blobs {
				payload := fmt.Sprintf(k.payload, m, b)
				scanned, err := h.input(c, call, subject{channel: k.channel, method: k.method, view: call}, []byte(payload), map[*ast.Term]string{})
				if err != nil {
					t.Logf("%s %s: refused by the scan: %v", k.method, payload, err)
					continue
				}
				fast, slow := bothWays(ctx, h, c, scanned)
				if fast != slow {
					t.Errorf("%s %s %s:\nwith the gateway's scan %.300s\nthe policy's long way   %.300s", k.channel, k.method, payload, fast, slow)
				}
			}
		}
	}
}
