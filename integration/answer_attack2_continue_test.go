package integration

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Attack (held): a response after the final answer. A DELETE that expects
// 100 Continue and announces a body it has not sent ("Expect:
// 100-continue", "Content-Length: 5", then nothing, as a client waiting
// for 100 Continue does) is answered 204, a final answer without a body
// (or refused, 400, for its body),
// with its body unread; EarlyAnswer.Finish then drains the body through
// net/http's expectContinueReader, whose first Read writes
// "HTTP/1.1 100 Continue" unless the answer already cleared its right to.
// Nothing follows the 204 on the connection before it is closed (an
// interim answer there would be read as the 100 Continue of the next
// request on the connection).
func TestAnswerAttack2ContinueAfterTheFinalAnswer(t *testing.T) {
	_, g, m := aliceSession(t, gatewayConfig{})
	c := dialAttack(t, g)
	if err := c.write(runnerHead(c, m, http.MethodDelete, aliceKey, "Expect: 100-continue\r\nContent-Length: 5\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, body, err := c.read(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE: %d %q", resp.StatusCode, truncate(body, 200))
	}
	// What follows the answer on the connection, until it is closed.
	_ = c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	rest, err := io.ReadAll(c.br)
	t.Logf("after the %d: %q (%v)", resp.StatusCode, rest, err)
	if strings.Contains(string(rest), "HTTP/1.1 100") {
		t.Fatalf("the gateway wrote an answer after the final one: %q", rest)
	}
}

// Attack (held): as above, for a GET that expects 100 Continue and
// announces a body it does not send (its stream, or a refusal for its
// body): no 100 Continue is written inside or after the answer.
func TestAnswerAttack2ContinueInsideAStream(t *testing.T) {
	_, g, m := aliceSession(t, gatewayConfig{})
	c, resp := openRawStream(t, g, m, "Expect: 100-continue\r\nContent-Length: 5\r\n\r\n", true)
	t.Logf("answer head: %d %v", resp.StatusCode, resp.Header)
	if resp.StatusCode == http.StatusOK {
		if status := m.delete(); status != http.StatusNoContent {
			t.Fatalf("DELETE: %d", status)
		}
	}
	_ = c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	rest, err := io.ReadAll(c.br)
	t.Logf("the stream's body, raw: %q (%v)", rest, err)
	if strings.Contains(string(rest), "HTTP/1.1 100") {
		t.Fatalf("the gateway wrote a 100 Continue inside or after the stream's answer: %q", rest)
	}
}
