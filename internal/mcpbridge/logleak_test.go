package mcpbridge

import (
	"context"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/toolgate/toolgate/internal/logtest"
	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// A server behind the bridge (a program, a legacy SSE server) gets the
// caller's credential (in its environment, in its requests' headers),
// and the bridge cannot redact what it never sees: a server request the
// bridge refuses, whose method the server made of that credential, must
// not put the method in the log. The server itself is told.
func TestRefusedServerRequestLogsNoMethodOfTheServers(t *testing.T) {
	const secret = "ghp_ServerWroteTheCredentialIntoAMethod"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	serverT, clientT := mcp.NewInMemoryTransports()
	server, err := serverT.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	client, err := clientT.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	b := New(Config{Service: "svc", MaxMessage: 1 << 20, Limits: mcpmsg.Limits{MaxDepth: 64}}, nil)
	defer b.Use(zap.New(core), time.Minute)()
	link := b.ConnLink(ctx, client, LinkConfig{Owned: true}, nil, &Unavailable{Reason: "the test server went away"})

	// The server side of the handshake, by hand.
	initialized := make(chan error, 1)
	go func() {
		_, err := link.Initialize(ctx, []byte(`{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"toolgate","version":"1"}}`))
		initialized <- err
	}()
	msg, err := server.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	init, ok := msg.(*jsonrpc.Request)
	if !ok || init.Method != "initialize" {
		t.Fatalf("the bridge sent %#v first", msg)
	}
	if err := server.Write(ctx, &jsonrpc.Response{ID: init.ID,
		Result: []byte(`{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"hostile","version":"1"}}`)}); err != nil {
		t.Fatal(err)
	}
	if err := <-initialized; err != nil {
		t.Fatalf("Initialize: %v", err)
	}

	// No runner has a request in progress or a stream open: refused.
	id, _ := jsonrpc.MakeID(float64(7))
	for _, method := range []string{"sampling/" + secret, secret} {
		if err := server.Write(ctx, &jsonrpc.Request{ID: id, Method: method, Params: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		for {
			msg, err := server.Read(ctx)
			if err != nil {
				t.Fatalf("the server got no answer to its request: %v", err)
			}
			if resp, ok := msg.(*jsonrpc.Response); ok && resp.ID == id {
				if resp.Error == nil {
					t.Fatalf("the request %q was not refused", method)
				}
				break
			}
		}
	}
	for _, line := range logtest.Leaked(t, logs, secret) {
		t.Errorf("the log holds what the server wrote into a method: %s", line)
	}
	refused := len(logs.FilterMessage("refused a server request").All())
	if refused != 2 {
		t.Errorf("%d refusals logged, want 2: %v", refused, logs.All())
	}
}
