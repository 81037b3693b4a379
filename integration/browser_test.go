package integration

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// person is someone's web browser, at the HTTP level: it keeps cookies,
// follows redirects and sends forms with the Origin header a browser sends.
// (The chromedp tests drive a real Chromium; these drive the same pages
// faster, for flows that are about the gateway rather than the page.)
type person struct {
	t      testing.TB
	g      *gateway
	client *http.Client
}

// newPerson is a browser nobody is signed in to yet.
func (g *gateway) newPerson(t testing.TB) *person {
	jar, _ := cookiejar.New(nil)
	return &person{t: t, g: g, client: &http.Client{Jar: jar}}
}

// signedIn is a browser signed in to the console with an API key.
func (g *gateway) signedIn(t testing.TB, key string) *person {
	t.Helper()
	p := g.newPerson(t)
	status, page := p.post(g.URL+"/console/signin", url.Values{"api_key": {key}})
	if status != http.StatusOK || !strings.Contains(page, "Services") {
		t.Fatalf("signing in to the console with an API key: %d %s", status, page)
	}
	return p
}

// get opens u and returns the final status and page.
func (p *person) get(u string) (int, string) {
	p.t.Helper()
	resp, err := p.client.Get(u)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// post sends a form from one of the gateway's pages.
func (p *person) post(u string, form url.Values) (int, string) {
	p.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", p.g.URL)
	resp, err := p.client.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf is the CSRF token of a console page.
func (p *person) csrf(page string) string {
	p.t.Helper()
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		p.t.Fatalf("no CSRF token on the page:\n%s", page)
	}
	return m[1]
}

// confirmConnect opens the connect page of service (or connectURL, as an
// error's connect_url gives it), confirms it, and returns toolgate's answer
// without following it to the provider.
func (p *person) confirmConnect(connectURL string) *http.Response {
	p.t.Helper()
	if !strings.HasPrefix(connectURL, "http") {
		connectURL = p.g.URL + "/console/connect/" + connectURL
	}
	status, page := p.get(connectURL)
	if status != http.StatusOK {
		p.t.Fatalf("the connect page %s: %d %s", connectURL, status, page)
	}
	u, _ := url.Parse(connectURL)
	req, _ := http.NewRequest(http.MethodPost, p.g.URL+u.Path, strings.NewReader(url.Values{"csrf": {p.csrf(page)}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", p.g.URL)
	noFollow := *p.client
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := noFollow.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	return resp
}

// startConnect confirms a connect and returns the provider's authorization
// URL toolgate sends the browser to, without opening it.
func (p *person) startConnect(connectURL string) string {
	p.t.Helper()
	resp := p.confirmConnect(connectURL)
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		p.t.Fatalf("confirming the connect: %d, want a redirect to the provider", resp.StatusCode)
	}
	return resp.Header.Get("Location")
}

// tryConnect confirms a connect and returns toolgate's answer when it is
// not a redirect to the provider.
func (p *person) tryConnect(connectURL string) (int, string) {
	p.t.Helper()
	resp := p.confirmConnect(connectURL)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// connect runs the whole connect flow in this browser: the connect page,
// the provider, and back to toolgate's callback. It returns the last page.
func (p *person) connect(connectURL string) (int, string) {
	p.t.Helper()
	return p.get(p.startConnect(connectURL))
}

// connectOAuth connects key's user to svc through the whole browser flow.
func (g *gateway) connectOAuth(t testing.TB, key string) {
	t.Helper()
	status, page := g.signedIn(t, key).connect("svc")
	if status != http.StatusOK || !strings.Contains(page, "is connected") {
		t.Fatalf("connecting: %d %s", status, page)
	}
}
