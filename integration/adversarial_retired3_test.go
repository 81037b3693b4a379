package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A third look at the tokens a connection no longer sends (commits
// 71fe40b and f81dbeb): the rejection mark, and App.CredentialNow — the
// search of what an upstream sends for the connection as the replica's
// cache holds it now.

// r3StreamAfterRefresh opens alice's standalone GET stream (OAuth token
// T1) on g, has the upstream refuse her next call so that toolgate
// refreshes the grant to T2 (the same grant: the stream stays open), and
// returns the stream, T2 and a push of a notification quoting T2 that
// returns what the runner got of it.
func r3StreamAfterRefresh(t *testing.T, g *gateway, p *oauthProvider, up *r2Upstream) (t2 string, quote func(marker string) string) {
	t.Helper()
	g.connectOAuth(t, aliceKey)
	m := r2Fresh(t, g, aliceKey)
	stream, stop := rcStream(t, m)
	t.Cleanup(stop)
	for i := 0; up.streamCount() == 0; i++ {
		if i > 200 {
			t.Fatal("premise: the runner's GET did not reach the upstream")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t1 := p.lastIssuedAccess(t)
	up.refuseNext(1)
	rdCall(t, m, 1)
	calls := up.callTokens()
	if len(calls) != 2 || calls[0] != t1 || calls[1] == t1 {
		t.Fatalf("premise: the call was not refused with T1 and sent again with a refreshed token (%d calls)", len(calls))
	}
	t2 = calls[1]
	quote = func(marker string) string {
		t.Helper()
		if n := up.push(`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"` + marker + ` ` + t2 + `"}}`); n != 1 {
			t.Fatalf("premise: the standalone stream closed (%d open)", n)
		}
		msg, _ := rcNext(stream, marker, 5*time.Second)
		if msg == "" {
			t.Fatalf("premise: the %s notification did not reach the runner's stream", marker)
		}
		return msg
	}
	return t2, quote
}

// Attack (fixed): App.CredentialNow (as it was) read the connection cache alone ("It never
// reads storage"), and a cache entry is not the connection: on a storage
// that announces nothing (file_system, the default) an entry older than
// cache_ttl is dropped by the very Get that CredentialNow makes
// (storecache.Cache.Get), and nothing on a standalone GET stream loads it
// again. Alice's runner holds its GET stream open (opened with her OAuth
// token T1); the upstream refuses a call of hers, toolgate refreshes to
// T2 (same grant: the stream goes on). Right after the refresh the
// upstream's notification quoting T2 on the stream is redacted (the
// control: the cache holds T2). cache_ttl later (3s here; 10s by default)
// the same notification reaches the runner with T2, the access token
// toolgate sends for alice now, in the clear: CredentialNow found no
// entry and the stream searched for T1 and its retired tokens only.
// (With PostgreSQL the entry goes at once: the refresh's announcement
// deletes it on every other replica, and a stream there never sees T2.)
// Breaks README: "An upstream that writes back the credential … or one
// that replaced the token a long-lived stream or listen was opened with —
// (in … a notification …) has it replaced by `[REDACTED:credential]`".
// Fixed: the search reads the connection as CredentialFor does (cached,
// else from storage: App.EachCallSecret, which replaced CredentialNow);
// when it cannot, the message is not relayed.
func TestRetired3AttackStreamMissesRefreshedTokenOnceTheCacheAged(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startR2(t)
	g := oauthGatewayAt(t, p, up.URL, gatewayConfig{Tools: "echo", Extra: "cache_ttl 3s"})
	t2, quote := r3StreamAfterRefresh(t, g, p, up)
	if msg := quote("control"); strings.Contains(msg, t2) {
		t.Fatalf("premise: T2 on the stream right after the refresh was not redacted: %s", msg)
	}
	time.Sleep(3500 * time.Millisecond) // past cache_ttl; nothing of alice's is called meanwhile
	if msg := quote("later"); strings.Contains(msg, t2) {
		t.Errorf("alice's runner got her current access token on its standalone stream once the replica's cache entry aged past cache_ttl: %s", msg)
	}
}

// Attack (fixed): the same across two replicas on PostgreSQL, which announces
// every change — the set-up the README names for this ("replicas share
// PostgreSQL for this"). Alice's runner holds a standalone GET stream
// open through replica b (her OAuth token T1, which b has cached). A
// call of hers through replica a is refused by the upstream; a refreshes
// the grant to T2 (the same grant: b's session and stream go on) and
// announces the change, and b drops its entry as it arrives
// (storecache.Cache.changed). The upstream writes T2 on b's stream: b's
// CredentialNow found no entry (it never read storage), and T2 — the
// token toolgate sends for alice now — reached her runner. Breaks README: "or one that replaced the token a
// long-lived stream or listen was opened with — … has it replaced by
// `[REDACTED:credential]`", and "Replicas on a storage that announces no
// change (`file_system`) learn of a token another replica stored within
// `cache_ttl` … replicas share PostgreSQL for this". Fixed as above: the
// announcement empties b's copy, and the search reads the connection
// again.
func TestRetired3AttackStreamOnOtherReplicaMissesRefreshedToken(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startR2(t)
	a, b, _ := soReplicas(t, testdataPath(t, "policy"), func(storage, data string) string {
		return soBlock(storage, data, up.URL, "echo", "auth "+oauthBlock(p, ""), "")
	})
	p.allowRedirect(a.URL + "/v1/connections/svc/callback")
	a.connectOAuth(t, aliceKey)
	t1 := p.lastIssuedAccess(t)
	mb := r2Fresh(t, b.gateway, aliceKey)
	rdCall(t, mb, 1) // b reads alice's connection: T1, cached
	stream, stop := rcStream(t, mb)
	defer stop()
	for i := 0; up.streamCount() == 0; i++ {
		if i > 200 {
			t.Fatal("premise: the runner's GET did not reach the upstream")
		}
		time.Sleep(20 * time.Millisecond)
	}
	ma := r2Fresh(t, a.gateway, aliceKey)
	up.refuseNext(1)
	rdCall(t, ma, 2)
	calls := up.callTokens()
	if len(calls) != 3 || calls[0] != t1 || calls[1] != t1 || calls[2] == t1 {
		t.Fatalf("premise: a's call was not refused with T1 and sent again with a refreshed token (%d calls)", len(calls))
	}
	t2 := calls[2]
	// b drops its copy as the announcement arrives there, within
	// milliseconds (until then b knows no T2: the window of the
	// announcement's delay, README). Nothing through b may read the
	// connection meanwhile: that would fill b's copy again.
	time.Sleep(2 * time.Second)
	if n := up.push(`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"now ` + t2 + `"}}`); n != 1 {
		t.Fatalf("premise: b's standalone stream closed at the refresh (%d open)", n)
	}
	msg, _ := rcNext(stream, "now", 5*time.Second)
	if msg == "" {
		t.Fatal("premise: the notification did not reach the runner's stream through b")
	}
	if strings.Contains(msg, t2) {
		t.Errorf("alice's runner got her current access token on its stream through replica b, after replica a refreshed it: %s", msg)
	}
}

// r3AuditLine waits for a line of the log file at path holding want.
func r3AuditLine(t *testing.T, path, want string) string {
	t.Helper()
	for i := 0; i < 100; i++ {
		data, _ := os.ReadFile(path)
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, want) {
				return line
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("premise: no log line with %q", want)
	return ""
}

// Attack (fixed): a decision's reason is taken out of the call's credential
// before anything reads it (policy.Config.newDecisionWithID:
// call.Credential.EachSecret), because a site policy may make its reason
// of the upstream's pieces — the credential written back split where no
// search of the message finds it is whole in the reason. f81dbeb made
// every search of what an upstream sends look for the connection's tokens
// as the replica holds them now (redacted → credentialNow), but not this
// one. Alice's standalone GET stream was opened with T1; a refused call
// refreshed her grant to T2. The upstream writes, on the stream, a
// notification whose params hold T1 split in two members: the site's
// result policy (deny, reason joined from the two) has T1 redacted in the
// audit entry (control). The same with T2 — the token toolgate sends for
// alice now, which this replica's cache holds — and the audit log (and
// the console's activity record, RecordDecision) gets T2 whole. Breaks
// README: "Upstream URLs and credentials never leave the gateway", the
// redaction of "one that replaced the token a long-lived stream or listen
// was opened with", and the reason's own contract (modules/policy
// TestReasonHoldsNoCredential: "The decision's reason, which the audit
// log, the console's activity record and the runner get, never holds
// it"). Fixed: the reason and the search take out the same secrets
// (App.EachCallSecret); a reason that cannot be searched is not shown.
func TestRetired3AttackPolicyReasonKeepsTheRefreshedToken(t *testing.T) {
	dir := t.TempDir()
	request, err := os.ReadFile(filepath.Join(testdataPath(t, "policy"), "request.rego"))
	if err != nil {
		t.Fatal(err)
	}
	result := `package toolgate.result

default decision := {"action": "allow"}

decision := {"action": "deny", "reason": concat("", ["quoting the upstream ", input.result.data, ": ", input.result.a, input.result.b])} if {
	input.result.a
}
`
	for name, text := range map[string]string{"request.rego": string(request), "result.rego": result} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	logFile := filepath.Join(t.TempDir(), "audit.log")
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startR2(t)
	g := oauthGatewayAt(t, p, up.URL, gatewayConfig{Tools: "echo", RequestPolicy: dir, ResultPolicy: dir,
		Log: "output file " + logFile + "\n\t\tlevel INFO"})
	t2, _ := r3StreamAfterRefresh(t, g, p, up)
	t1 := up.callTokens()[0]
	split := func(marker, token string) {
		t.Helper()
		if n := up.push(`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"` + marker +
			`","a":"` + token[:10] + `","b":"` + token[10:] + `"}}`); n != 1 {
			t.Fatalf("premise: the standalone stream closed (%d open)", n)
		}
	}
	split("control-t1", t1)
	if line := r3AuditLine(t, logFile, "quoting the upstream control-t1"); strings.Contains(line, t1) {
		t.Fatalf("premise: the stream's own token whole in the audit entry's reason: %s", line)
	}
	split("now-t2", t2)
	if line := r3AuditLine(t, logFile, "quoting the upstream now-t2"); strings.Contains(line, t2) {
		t.Errorf("the audit log got alice's current access token whole in a decision's reason on her stream: %s", line)
	}
}
