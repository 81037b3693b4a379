package mcpproxy

// Adversarial review: no secret reaches anyone who should not have it
// through what toolgate ANSWERS. The attacker here is a malicious upstream,
// which controls every byte it answers and may write back the credential
// toolgate attached to the call's upstream requests: a service's
// `auth header` value (one credential for every user of the service, which
// no runner may hold), or a user's token. What the runner gets is the
// message response.next returns (leakRead, in logleak_adversarial_test.go).

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// answerLeakSecret is the secret part of the service-wide credentials
// below; it matches none of the default result policy's secret patterns.
const answerLeakSecret = "Qm9vW2x8TfZp4KcR7yLsHd3N"

// answerLeakCall is a tools/call of alice's on a service whose upstream
// requests carry the service-wide header "header: value"
// (`auth header <header> <value>`).
func answerLeakCall(header, value string) *gateway.Call {
	c := leakCall()
	c.Service = &gateway.Service{ID: "svc", Auth: &gateway.UpstreamAuth{Kind: gateway.AuthHeader, Header: header, Value: value}}
	c.Credential = &gateway.Credential{Header: header, Value: value}
	return c
}

// answerLeakResult is an upstream's tool result whose one text item is text.
func answerLeakResult(text string) string {
	return `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":` + string(mcpmsg.Quote(text)) + `}]}}`
}

// Attack (fixed): the service's credential is a header value with a space in it —
// `auth header Cookie "sid=<secret>; lang=en"` (a session cookie followed
// by another cookie), or `auth header X-Api-Key "<secret> v2"`. The
// upstream writes back the header it was sent (an echo tool, or an error
// "bad cookie: sid=…"). gateway.Credential.Secret takes everything before
// the first space for an auth scheme ("Bearer", "Basic") and keeps only
// what follows it: "lang=en" (shorter than MinSecret, so nothing at all is
// looked for) or "v2". redactCredential never searches for the real
// secret, and the runner gets the service-wide credential in the result.
// Fixed: gateway.Credential.EachSecret gives each piece of another
// header's value (a cookie's value without its name) to the search.
func TestAnswerLeakAttackHeaderValueWithASpaceIsNotRedacted(t *testing.T) {
	for _, c := range []struct{ header, value string }{
		{"Cookie", "sid=" + answerLeakSecret + "; lang=en"},
		{"Cookie", "sid=" + answerLeakSecret + "; theme=dark-high-contrast"},
		{"X-Api-Key", answerLeakSecret + " v2"},
	} {
		h, _ := leakHandler()
		call := answerLeakCall(c.header, c.value)
		msg, err := leakRead(h, call, answerLeakResult("echo: "+c.header+": "+c.value))
		if err != nil {
			t.Fatalf("%s: %s: control: the upstream's answer was refused: %v", c.header, c.value, err)
		}
		if strings.Contains(string(msg.Raw), answerLeakSecret) {
			t.Errorf("auth header %s %q: the runner's answer holds the service's credential: %s", c.header, c.value, msg.Raw)
		}
	}
}

// Attack (fixed): the service's credential is HTTP Basic —
// `auth header Authorization "Basic <base64 of robot:password>"`. The
// upstream decodes the header it was sent and writes back
// "robot:<password>" (a Basic-auth server quoting the credentials it
// refused, or a hostile one). Secret is the base64 text only, and the
// redaction looks for it as it is, escaped, and inside base64 — never for
// the user:password it encodes. The runner gets the service's password.
// Fixed: EachSecret gives the password a Basic value encodes too.
func TestAnswerLeakAttackBasicCredentialDecodedIsNotRedacted(t *testing.T) {
	pair := "robot:" + answerLeakSecret
	value := "Basic " + base64.StdEncoding.EncodeToString([]byte(pair))
	h, _ := leakHandler()
	call := answerLeakCall("Authorization", value)
	msg, err := leakRead(h, call, answerLeakResult("401: the credentials "+pair+" were refused"))
	if err != nil {
		t.Fatalf("control: the upstream's answer was refused: %v", err)
	}
	if strings.Contains(string(msg.Raw), answerLeakSecret) {
		t.Errorf("the runner's answer holds the service's Basic password: %s", msg.Raw)
	}
	// Control: the base64 form itself is redacted.
	msg, err = leakRead(h, call, answerLeakResult("sent: "+value))
	if err != nil || strings.Contains(string(msg.Raw), value[len("Basic "):]) {
		t.Fatalf("control: the base64 credential was not redacted (%v): %s", err, msg.Raw)
	}
}

// Holds: a service-wide header without a space (`auth header X-Api-Key
// <secret>`) and an OAuth/bearer "Bearer <token>" written back in a
// result, in a JSON-RPC error's message and data, in an object key, as
// the protocolVersion of an initialize answer, escaped (\u0051, \/) or
// in base64: the runner's message never holds it.
func TestAnswerLeakHoldsSingleTokenCredentials(t *testing.T) {
	for _, value := range []string{answerLeakSecret, "Bearer " + answerLeakSecret} {
		call := answerLeakCall("X-Api-Key", value)
		if strings.HasPrefix(value, "Bearer") {
			call = answerLeakCall("Authorization", value)
		}
		b64 := base64.StdEncoding.EncodeToString([]byte("k=" + answerLeakSecret))
		for _, body := range []string{
			answerLeakResult("echo " + value),
			`{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"bad key ` + answerLeakSecret + `","data":{"sent":"` + value + `"}}}`,
			`{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":{"` + answerLeakSecret + `":1},"capabilities":{}}}`,
			`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"\u0051` + answerLeakSecret[1:] + `"}]}}`,
			answerLeakResult("blob " + b64),
		} {
			h, _ := leakHandler()
			msg, err := leakRead(h, call, body)
			if err != nil && strings.Contains(err.Error(), answerLeakSecret) {
				t.Errorf("%s: the error the runner gets holds the credential: %v", body, err)
			}
			if err == nil && (strings.Contains(string(msg.Raw), answerLeakSecret) || strings.Contains(string(msg.Raw), b64)) {
				t.Errorf("%s: the runner's answer holds the credential: %s", body, msg.Raw)
			}
		}
	}
}
