package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
)

// The console in a real browser: Debian's Chromium driven by chromedp.
// Each test screenshots the pages it visits into the artifacts folder
// (TOOLGATE_ARTIFACTS, default .artifacts/console at the repository root,
// not committed) so that a person can look at them.

// chromium starts a headless Chromium for the test and returns a context
// whose actions run in one tab. With TOOLGATE_REQUIRE_PEERS=1 a missing
// browser fails the test.
func chromium(t *testing.T) context.Context {
	t.Helper()
	var path string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		requirePeer(t, "no chromium on PATH: install Debian's chromium (apt-get install chromium)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
		// This machine has no network: background fetches only fail.
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(alloc)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		cancelTab()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}
	return ctx
}

// artifacts is the folder screenshots go to.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("TOOLGATE_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("..", ".artifacts")
	}
	dir = filepath.Join(dir, "console")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// shoot saves a full-page screenshot of the tab as name.png.
func shoot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(artifacts(t), name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// run runs browser actions, failing the test with what was being done.
func run(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		url, _ := chromedp.Run(ctx, chromedp.Location())
		text, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
		t.Fatalf("%s: %v\nat %s:\n%.2000s", what, err, url, text)
	}
}

// textOf returns the visible text of the first element matching sel.
func textOf(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("reading %s: %v", sel, err)
	}
	return s
}

// startDemo runs caddyfile/demo.Caddyfile on free ports, as in the
// README's walk-through.
func startDemo(t *testing.T) *gateway {
	t.Helper()
	gwPort, upPort := freePort(t), freePort(t)
	loadCaddyfile(t, demoCaddyfile(t, gwPort, upPort, ""))
	g := &gateway{URL: fmt.Sprintf("http://127.0.0.1:%d", gwPort)}
	waitListening(t, g.URL)
	waitListening(t, fmt.Sprintf("http://127.0.0.1:%d", upPort))
	return g
}

// The README's browser path on the demo: sign in with demo-alice, connect
// the tracker through its provider, test it, create a session with the
// picker and use the copied Inspector setup, disconnect.
func TestBrowserDemoJourney(t *testing.T) {
	ctx := chromium(t)
	g := startDemo(t)

	run(t, ctx, "opening the console", chromedp.Navigate(g.URL+"/console/"), chromedp.WaitVisible(chromedp.ID("api_key")))
	shoot(t, ctx, "01-signin")
	run(t, ctx, "signing in with an API key",
		chromedp.SendKeys(chromedp.ID("api_key"), "demo-alice"),
		chromedp.Submit(chromedp.ID("api_key")),
		chromedp.WaitVisible(chromedp.ID("service-tracker")))
	if who := textOf(t, ctx, ".who .user"); who != "alice@example.test" {
		t.Fatalf("signed in as %q", who)
	}
	if status := textOf(t, ctx, "#service-tracker .status"); status != "Sign in needed" {
		t.Fatalf("the tracker before connecting: %q", status)
	}
	shoot(t, ctx, "02-services")

	run(t, ctx, "opening the connect page",
		chromedp.Click(chromedp.CSS(`#service-tracker a[href="/console/connect/tracker"]`)),
		chromedp.WaitVisible(chromedp.CSS(`form[action="/console/connect/tracker"] button`)))
	shoot(t, ctx, "03-connect")
	run(t, ctx, "connecting through the provider",
		chromedp.Click(chromedp.CSS(`form[action="/console/connect/tracker"] button`)),
		// The connect page has an h1 too: wait for the page the
		// provider sends the browser back to.
		chromedp.WaitVisible(chromedp.Search(`//h1[not(starts-with(normalize-space(.), "Connect "))]`)))
	if h1 := textOf(t, ctx, "h1"); h1 != "Demo work tracker is connected" {
		t.Fatalf("after the provider: %q", h1)
	}
	shoot(t, ctx, "04-connected")

	run(t, ctx, "testing the connection",
		chromedp.Navigate(g.URL+"/console/services"),
		chromedp.Click(chromedp.CSS(`form[action="/console/services/tracker/test"] button`)),
		chromedp.WaitVisible(chromedp.CSS("#service-tracker .result")))
	if res := textOf(t, ctx, "#service-tracker .result"); res != "Test passed." {
		t.Fatalf("the connection test: %q", res)
	}
	if status := textOf(t, ctx, "#service-tracker .status"); status != "Connected" {
		t.Fatalf("the tracker after connecting: %q", status)
	}
	shoot(t, ctx, "05-tested")

	run(t, ctx, "creating a session with the picker",
		chromedp.Navigate(g.URL+"/console/sessions"),
		chromedp.Click(chromedp.ID("pick-tracker")),
		chromedp.Submit(chromedp.ID("pick-tracker")),
		chromedp.WaitVisible(chromedp.ID("inspector-tracker")))
	shoot(t, ctx, "06-session-created")
	copied, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.ID("inspector-tracker")))
	if err != nil {
		t.Fatalf("copying the Inspector setup: %v", err)
	}
	endpoint, headers := parseSetup(t, copied)
	cs := connectWithSetup(t, endpoint, headers, "demo-alice")
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("whoami with the copied setup: %+v, %v", res, err)
	}
	if text, _ := json.Marshal(res.Content); !strings.Contains(string(text), "alice@example.test") {
		t.Fatalf("whoami with the copied setup: %s", text)
	}

	run(t, ctx, "opening the activity page", chromedp.Navigate(g.URL+"/console/activity"), chromedp.WaitVisible(chromedp.CSS("main")))
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(textOf(t, ctx, "main"), "whoami") && time.Now().Before(deadline); {
		time.Sleep(300 * time.Millisecond)
		run(t, ctx, "reloading the activity page", chromedp.Reload())
	}
	if main := textOf(t, ctx, "main"); !strings.Contains(main, "whoami") || !strings.Contains(main, "allow") {
		t.Fatalf("the activity page after whoami:\n%s", main)
	}
	shoot(t, ctx, "07-activity")

	run(t, ctx, "disconnecting",
		chromedp.Navigate(g.URL+"/console/services"),
		chromedp.Click(chromedp.CSS(`form[action="/console/services/tracker/disconnect"] button`)),
		chromedp.WaitVisible(chromedp.CSS(".notice.ok")))
	if status := textOf(t, ctx, "#service-tracker .status"); status != "Sign in needed" {
		t.Fatalf("the tracker after disconnecting: %q", status)
	}
	shoot(t, ctx, "08-disconnected")

	// Readable on a phone.
	run(t, ctx, "a phone-sized window", chromedp.EmulateViewport(390, 844), chromedp.Navigate(g.URL+"/console/sessions"), chromedp.WaitVisible(chromedp.CSS("main")))
	shoot(t, ctx, "09-phone-sessions")

	run(t, ctx, "signing out",
		chromedp.EmulateViewport(1280, 900),
		chromedp.Click(chromedp.CSS(`form[action="/console/signout"] button`)),
		chromedp.WaitVisible(chromedp.ID("api_key")))
	run(t, ctx, "a page after signing out", chromedp.Navigate(g.URL+"/console/services"), chromedp.WaitVisible(chromedp.ID("api_key")))
}

// Sign-in with OpenID Connect against a real OpenID provider (zitadel's
// certified library, with its example login page), in the browser.
func TestBrowserOIDCSignIn(t *testing.T) {
	ctx := chromium(t)
	issuer, password := startOpenIDProvider(t)
	gwPort := freePort(t)
	gwURL := fmt.Sprintf("http://127.0.0.1:%d", gwPort)
	storage.RegisterClients(storage.WebClient("console-client", "console-secret", gwURL+"/console/signin/callback"))
	up := startUpstream(t)
	g := startGatewayOnPort(t, gwPort, gatewayConfig{Upstream: up.URL, Extra: "state_secret " + testStateSecret,
		Console: "oidc " + issuer + " {\n\t\t\tclient_id console-client\n\t\t\tclient_secret console-secret\n\t\t\tuser_claim email\n\t\t\tname \"Sign in with the test provider\"\n\t\t}"})

	run(t, ctx, "opening the sign-in page", chromedp.Navigate(g.URL+"/console/sessions"), chromedp.WaitVisible(chromedp.CSS(".choices a")))
	if label := textOf(t, ctx, ".choices a"); label != "Sign in with the test provider" {
		t.Fatalf("the sign-in button: %q", label)
	}
	run(t, ctx, "going to the provider", chromedp.Click(chromedp.CSS(".choices a")), chromedp.WaitVisible(chromedp.ID("username")))
	shoot(t, ctx, "10-oidc-provider-login")
	run(t, ctx, "signing in at the provider",
		chromedp.SendKeys(chromedp.ID("username"), "alice"),
		chromedp.SendKeys(chromedp.ID("password"), password),
		chromedp.Submit(chromedp.ID("password")),
		chromedp.WaitVisible(chromedp.CSS(".who .user")))
	if who := textOf(t, ctx, ".who .user"); who != alice {
		t.Fatalf("signed in through the provider as %q, want %s", who, alice)
	}
	loc, _ := chromedp.Run(ctx, chromedp.Location())
	if loc != g.URL+"/console/sessions" {
		t.Errorf("after sign-in the browser is at %s, want the page it asked for", loc)
	}
	shoot(t, ctx, "11-oidc-signed-in")

	// The callback cannot be replayed: its state cookie is spent.
	run(t, ctx, "replaying a callback", chromedp.Navigate(g.URL+"/console/signin/callback?state=x&code=y"), chromedp.WaitVisible(chromedp.CSS("h1")))
	if h1 := textOf(t, ctx, "h1"); h1 != "Not signed in" {
		t.Errorf("a replayed callback: %q", h1)
	}
}

// startOpenIDProvider runs an OpenID provider with one user, alice, whose
// email is alice@example.test, and returns its issuer URL and alice's
// password.
func startOpenIDProvider(t *testing.T) (string, string) {
	return startExampleProvider(t, func(s *storage.Storage) exampleop.Storage { return s })
}

// startExampleProvider runs zitadel's example OpenID provider on loopback
// with one user, alice (email alice@example.test), over the storage that
// wrap makes of its own, and returns its issuer URL and alice's password.
func startExampleProvider(t *testing.T, wrap func(*storage.Storage) exampleop.Storage) (string, string) {
	t.Helper()
	return startExampleProviderBehind(t, wrap, nil)
}

// startExampleProviderBehind is startExampleProvider with the provider's
// handler passed through front (when not nil), to record what it is sent
// and answers.
func startExampleProviderBehind(t *testing.T, wrap func(*storage.Storage) exampleop.Storage, front func(http.Handler) http.Handler) (string, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	issuer := "http://" + l.Addr().String()
	const password = "correct horse battery staple"
	users := map[string]*storage.User{"alice-id": {ID: "alice-id", Username: "alice", Password: password,
		FirstName: "Alice", LastName: "Test", Email: alice, EmailVerified: true}}
	file := filepath.Join(t.TempDir(), "users.json")
	data, _ := json.Marshal(users)
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := storage.StoreFromFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = exampleop.SetupServer(issuer, wrap(storage.NewStorage(store)), nil, false)
	if front != nil {
		h = front(h)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return issuer, password
}

// An approver opens the approval page a runner was given, signs in, and
// approves for the session from the page: the runner's next identical calls
// go through.
func TestBrowserApproval(t *testing.T) {
	ctx := chromium(t)
	up, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	p := mustPend(t, m.call(1, "gated_tool", `{"text":"deploy the docs","project":"apollo"}`))

	run(t, ctx, "opening the approval link", chromedp.Navigate(p.ApprovalURL), chromedp.WaitVisible(chromedp.ID("api_key")))
	run(t, ctx, "signing in",
		chromedp.SendKeys(chromedp.ID("api_key"), aliceKey),
		chromedp.Submit(chromedp.ID("api_key")),
		chromedp.WaitVisible(chromedp.ID("arguments")))
	if args := textOf(t, ctx, "#arguments"); !strings.Contains(args, `"deploy the docs"`) || !strings.Contains(args, `"[masked]"`) || strings.Contains(args, "apollo") {
		t.Fatalf("the arguments on the approval page: %s", args)
	}
	shoot(t, ctx, "12-approval")
	run(t, ctx, "approving for the session",
		chromedp.Click(chromedp.ID("scope-session")),
		chromedp.Click(chromedp.CSS(`form[action$="/approve"] button`)),
		chromedp.WaitVisible(chromedp.CSS(".notice.ok")))
	if n := textOf(t, ctx, ".notice.ok"); !strings.Contains(n, "Approved for identical calls in that session") {
		t.Fatalf("after approving: %q", n)
	}
	shoot(t, ctx, "13-approved")
	for i := range 2 {
		mustSucceed(t, m.call(2+i, "gated_tool", `{"text":"deploy the docs","project":"apollo"}`))
	}
	if n := up.upstreamCalls("gated_tool"); n != 2 {
		t.Fatalf("the upstream saw %d calls, want the 2 approved ones", n)
	}

	// The queue, with another pending request.
	mustPend(t, m.call(4, "gated_tool", `{"text":"something else"}`))
	run(t, ctx, "opening the queue", chromedp.Navigate(g.URL+"/console/approvals"), chromedp.WaitVisible(chromedp.CSS("table.queue")))
	shoot(t, ctx, "14-approvals-queue")
}
