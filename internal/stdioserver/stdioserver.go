// Package stdioserver is an MCP server built with the official Go SDK that
// tests run as a program speaking over stdio — the test binary itself, in
// a mode its TestMain recognises (see Mode) — with tools that report what
// the program sees (its environment, its process) and tools that make it
// misbehave on demand (crash, flood its stdout, hang), or work on after they
// answered (background, finish).
package stdioserver

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// EnvMode is the environment variable that puts a test binary in a mode:
// a test service lists it in its env (nothing else of the test's
// environment reaches the program).
const EnvMode = "TOOLGATE_TEST_STDIO_SERVER"

// The modes.
const (
	ModeServe      = "serve"       // an MCP server
	ModeIgnoreTerm = "ignore-term" // an MCP server that ignores SIGTERM and stays after stdin closes
	ModeExit       = "exit"        // exits with status 1 at once
)

// Mode returns the mode the process was started in, "" for none.
func Mode() string { return os.Getenv(EnvMode) }

// Main runs mode and returns the exit status.
func Main(mode string) int {
	switch mode {
	case ModeExit:
		fmt.Fprintln(os.Stderr, "exiting at once, as asked")
		return 1
	case ModeIgnoreTerm:
		signal.Ignore(syscall.SIGTERM)
		serve()
		for { // stdin closed: stay until killed
			time.Sleep(time.Hour)
		}
	case ModeServe:
		serve()
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown mode %q\n", mode)
	return 2
}

func serve() {
	s := mcp.NewServer(&mcp.Implementation{Name: "stdio-test-server", Version: "1.0.0"}, &mcp.ServerOptions{
		SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { return nil },
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
	})
	Register(s)
	fmt.Fprintln(os.Stderr, "stdio test server ready; secret in env:", os.Getenv("TEST_SECRET"))
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "server ended:", err)
	}
}

// Register adds the test tools to s.
func Register(s *mcp.Server) {
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true}
	text := func(t string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: t}}}
	}
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Echoes text.", Annotations: readOnly},
		func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			Text string `json:"text"`
		}) (*mcp.CallToolResult, any, error) {
			return text(in.Text), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "env", Description: "Returns the program's environment, sorted.", Annotations: readOnly},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			env := os.Environ()
			slices.Sort(env)
			b, _ := json.Marshal(env)
			return text(string(b)), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "whoami", Description: "Returns the program's pid, process group, uid and working directory.", Annotations: readOnly},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			wd, _ := os.Getwd()
			pgid, _ := syscall.Getpgid(0)
			b, _ := json.Marshal(map[string]any{"pid": os.Getpid(), "pgid": pgid, "uid": os.Getuid(), "dir": wd})
			return text(string(b)), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "progress", Description: "Reports progress steps, then answers.", Annotations: readOnly},
		func(ctx context.Context, req *mcp.CallToolRequest, in struct {
			Steps int `json:"steps"`
		}) (*mcp.CallToolResult, any, error) {
			token := req.Params.GetProgressToken()
			for i := 1; i <= in.Steps && token != nil; i++ {
				if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token,
					Progress: float64(i), Total: float64(in.Steps), Message: fmt.Sprintf("step %d", i)}); err != nil {
					return nil, nil, err
				}
			}
			return text(fmt.Sprintf("%d steps done", in.Steps)), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "sample", Description: "Asks the client to sample a message, and returns its text.", Annotations: readOnly},
		func(ctx context.Context, req *mcp.CallToolRequest, in struct {
			Prompt string `json:"prompt"`
		}) (*mcp.CallToolResult, any, error) {
			res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10,
				Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: in.Prompt}}}})
			if err != nil {
				return text("sampling failed: " + err.Error()), nil, nil
			}
			t, _ := res.Content.(*mcp.TextContent)
			if t == nil {
				return text("sampled something that is not text"), nil, nil
			}
			return text("sampled: " + t.Text), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "wait", Description: "Works until cancelled (at most 30s); with a progress token, first reports that it is waiting.", Annotations: readOnly},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			if token := req.Params.GetProgressToken(); token != nil {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Message: "waiting"})
			}
			select {
			case <-ctx.Done():
				fmt.Fprintln(os.Stderr, "wait was cancelled")
				return nil, nil, ctx.Err()
			case <-time.After(30 * time.Second):
				return text("waited 30s"), nil, nil
			}
		})
	// background holds what the tool "background" goes on working on
	// after it answered: "finish" logs that each is done.
	var background struct {
		sync.Mutex
		texts []string
	}
	mcp.AddTool(s, &mcp.Tool{Name: "background", Description: "Answers at once and goes on working on text, until a call of finish.", Annotations: readOnly},
		func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			Text string `json:"text"`
		}) (*mcp.CallToolResult, any, error) {
			background.Lock()
			background.texts = append(background.texts, in.Text)
			background.Unlock()
			return text("started"), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "finish", Description: "Finishes the background work: logs that it finished working on each text (at level info, naming no request; nothing before a client set a log level), then answers how many it finished.", Annotations: readOnly},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			background.Lock()
			texts := background.texts
			background.texts = nil
			background.Unlock()
			for _, t := range texts {
				if err := req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: "finished working on " + t}); err != nil {
					return nil, nil, err
				}
			}
			return text(fmt.Sprintf("finished %d", len(texts))), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "crash", Description: "Exits the program with status 3.", Annotations: readOnly},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			os.Exit(3)
			return nil, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "flood", Description: "Writes a line to stdout that never ends.", Annotations: readOnly},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			chunk := []byte(`{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"` + strings.Repeat("x", 64<<10))
			for {
				if _, err := os.Stdout.Write(chunk); err != nil {
					os.Exit(4)
				}
				chunk = chunk[len(chunk)-64<<10:]
			}
		})
	mcp.AddTool(s, &mcp.Tool{Name: "shout", Description: "Writes its text to stderr (or, with stdout, to stdout), count times.", Annotations: readOnly},
		func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			Text   string `json:"text"`
			Count  int    `json:"count"`
			Stdout bool   `json:"stdout,omitempty"`
		}) (*mcp.CallToolResult, any, error) {
			out := os.Stderr
			if in.Stdout {
				out = os.Stdout
			}
			for range max(in.Count, 1) {
				fmt.Fprintln(out, in.Text)
			}
			return text("shouted"), nil, nil
		})
}
