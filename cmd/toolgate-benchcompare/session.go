package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
)

// protocolVersion is the MCP revision the generator speaks.
const protocolVersion = "2025-11-25"

// initialize opens an MCP session on r: initialize, then
// notifications/initialized. It returns the session id.
func (r *route) initialize(ctx context.Context) (string, error) {
	resp, err := r.post(ctx, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"`+protocolVersion+`","capabilities":{},"clientInfo":{"name":"toolgate-benchcompare","version":"1"}}}`)
	if err != nil {
		return "", fmt.Errorf("initialize at %s: %v", r.url, err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || session == "" || !bytes.Contains(data, []byte(`"result"`)) {
		return "", fmt.Errorf("initialize at %s: HTTP %d, session %q: %.300s", r.url, resp.StatusCode, session, data)
	}
	resp, err = r.post(ctx, session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if err != nil {
		return "", fmt.Errorf("notifications/initialized at %s: %v", r.url, err)
	}
	data, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return "", fmt.Errorf("notifications/initialized at %s: HTTP %d: %.300s", r.url, resp.StatusCode, data)
	}
	return session, nil
}

// openSessions initializes n MCP sessions on r, conc at a time, and
// returns their ids.
func (r *route) openSessions(ctx context.Context, n, conc int) ([]string, error) {
	ids := make([]string, n)
	var (
		next     atomic.Int64
		firstErr error
		once     sync.Once
		wg       sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range min(conc, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				id, err := r.initialize(ctx)
				if err != nil {
					once.Do(func() { firstErr = fmt.Errorf("session %d of %d: %v", i+1, n, err); cancel() })
					return
				}
				ids[i] = id
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return ids, ctx.Err()
}

// createToolgateSession creates a toolgate session for the API key's owner
// that selects services, and returns its id.
func createToolgateSession(ctx context.Context, client *http.Client, base, key string, services []string) (string, error) {
	body, _ := json.Marshal(map[string]any{"services": services})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/sessions", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("POST /v1/sessions: %v", err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var s struct{ ID string }
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(data, &s) != nil || s.ID == "" {
		return "", fmt.Errorf("POST /v1/sessions: HTTP %d: %.300s", resp.StatusCode, data)
	}
	return s.ID, nil
}
