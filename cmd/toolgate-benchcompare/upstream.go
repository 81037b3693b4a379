package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The upstream is an MCP server built with the official Go SDK, run as
// `toolgate-benchcompare upstream -listen ADDR [-json]`: this same binary,
// exec'd as its own process. It serves Streamable HTTP on every path and
// has two read-only tools:
//
//   - echo: answers with its arguments as JSON text (the small call);
//   - big: answers with a text of the requested number of bytes.
//
// By default it answers POSTs over SSE, as the SDK does; -json makes it
// answer with plain JSON bodies (StreamableHTTPOptions.JSONResponse).

// bigLine is what the big tool's text repeats.
const bigLine = "lorem ipsum dolor sit amet, consectetur adipiscing elit\n"

func runUpstream(args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "the loopback address to serve on")
	jsonResponse := fs.Bool("json", false, "answer POSTs with JSON bodies instead of SSE streams")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if host, _, err := net.SplitHostPort(*listen); err != nil || !net.ParseIP(host).IsLoopback() {
		return fmt.Errorf("upstream: -listen %q: want a loopback address such as 127.0.0.1:9000", *listen)
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	server := newUpstreamServer()
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{
		JSONResponse: *jsonResponse,
		// The SDK keeps sessions forever by default; the idle-session
		// phase opens thousands.
		SessionTimeout: 30 * time.Minute,
	})
	// No write timeout: it would cut SSE responses.
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(l); err != http.ErrServerClosed {
		return err
	}
	return nil
}

func newUpstreamServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "benchcompare-upstream", Version: "1.0.0"}, nil)
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true}
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Echo the arguments.", Annotations: readOnly},
		func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			Text string `json:"text"`
		}) (*mcp.CallToolResult, any, error) {
			text, _ := json.Marshal(in)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(text)}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "big", Description: "Returns a text of the given size.", Annotations: readOnly},
		func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			Bytes int `json:"bytes"`
		}) (*mcp.CallToolResult, any, error) {
			if in.Bytes < 0 || in.Bytes > 64<<20 {
				return nil, nil, fmt.Errorf("bytes: %d is not between 0 and 64 MiB", in.Bytes)
			}
			text := strings.Repeat(bigLine, in.Bytes/len(bigLine)+1)[:in.Bytes]
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
		})
	return s
}
