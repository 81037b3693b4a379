package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/toolgate/toolgate/internal/pgtest"
)

// The console page a browser gets when toolgate takes longer than its
// wait (10 s) to start, as a person sees it: a 503 that says to reload,
// with Retry-After, laid out with the console's stylesheet, which is
// served while toolgate starts.
//
// Start is held first at its database check (by a proxy in front of a
// real PostgreSQL), so that the browser's request is taken early in it,
// then at its identity provider's JWKS, until the request's wait is over.
// Each of those steps gives up after 10 s of its own.
func TestBrowserStartingPage(t *testing.T) {
	up := startUpstream(t)
	pg := pgtest.Shared(t)
	proxy := r8StartHoldingProxy(t, fmt.Sprintf("127.0.0.1:%d", pg.Port))
	ctx := chromium(t)
	for range 12 {
		// A database of each start's own: each has a key of its own.
		dsn := strings.Replace(pg.CreateDatabase(t), fmt.Sprintf("127.0.0.1:%d", pg.Port), proxy.addr, 1)
		if startingPageInWindow(t, ctx, up, proxy, dsn) {
			return
		}
	}
	t.Fatal("in 12 starts, Caddy never started its HTTP server before the toolgate app: the page was not seen")
}

// startingPageInWindow starts a gateway whose Start waits on its database
// (pg, held), then on its JWKS and, if its HTTP server listens meanwhile,
// opens the console in the browser there. It reports whether the page was
// seen.
func startingPageInWindow(t *testing.T, ctx context.Context, up *upstream, pg *r8HoldingProxy, dsn string) bool {
	t.Helper()
	letDatabase := pg.holdAgain()
	defer letDatabase()
	held := startHeldAtJWKS(t, up, func(caddyfile, data string) string {
		return strings.Replace(caddyfile, "storage file_system "+data, "storage postgres "+dsn, 1)
	})
	jwks, loaded, addr := held.jwks, held.loaded, held.addr
	defer func() {
		letDatabase()
		held.stop(t)
	}()
	held.heldAt(t, pg.asked, "checked its database")
	if !listensSoon(addr) {
		return false
	}

	// The page's answer comes when its wait for Start (10 s) is over.
	type opened struct {
		resp *network.Response
		err  error
	}
	page := make(chan opened, 1)
	go func() {
		resp, err := chromedp.Run(ctx, chromedp.NavigateResponse("http://"+addr+"/console/"))
		page <- opened{resp, err}
	}()
	// Pacing only: the database check goes on well after the request was
	// taken, and Start then waits on the JWKS (up to 10 s) past the
	// request's wait.
	time.Sleep(7 * time.Second)
	letDatabase()
	select {
	case <-jwks.asked:
	case <-time.After(5 * time.Second):
		t.Fatal("the gateway's start did not go on to fetch its JWKS")
	}
	o := <-page
	resp, err := o.resp, o.err
	if err != nil {
		t.Fatalf("opening the console while the gateway started: %v", err)
	}
	if retry, _ := resp.Headers["Retry-After"].(string); resp.Status != http.StatusServiceUnavailable || retry == "" {
		t.Fatalf("the console while the gateway started: %d (Retry-After %q), want 503 with Retry-After", resp.Status, retry)
	}
	// The page has loaded, its stylesheet with it, while Start still waits
	// on the JWKS: the stylesheet did not wait for Start.
	if len(loaded) > 0 {
		t.Fatal("the console's page loaded only once toolgate had started: its stylesheet waited for the start")
	}
	shoot(t, ctx, "22-starting")
	title, _ := chromedp.Run(ctx, chromedp.Title())
	if body := textOf(t, ctx, "body"); !strings.Contains(body, "Reload this page in a moment") || !strings.Contains(title, "Starting") {
		t.Fatalf("the page while the gateway started (title %q) does not say to reload:\n%.1000s", title, body)
	}
	// Laid out: the stylesheet loaded (it takes the skip link off the
	// page until it has the focus).
	position, err := chromedp.Run(ctx, chromedp.Evaluate[string](`getComputedStyle(document.querySelector(".skip")).position`))
	if err != nil || position != "absolute" {
		t.Fatalf("the page while the gateway started is not laid out with the console's stylesheet (the skip link's position %q, %v)", position, err)
	}
	return true
}
