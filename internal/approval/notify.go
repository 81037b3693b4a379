package approval

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/gateway"
)

// The webhook body announcing a pending approval:
//
//	{"type": "approval.requested", "delivery": "<id>", "approval": {
//	  "id": …, "url": …, "state": "pending", "stage": "request", "requester": …,
//	  "service": …, "method": …, "tool": …, "reason": …, "decision_id": …,
//	  "scopes": […], "created_at": …, "expires_at": …,
//	  "arguments": {…}}}          (only with include_arguments; masked)
//
// Headers: X-Toolgate-Timestamp (Unix seconds), X-Toolgate-Delivery (the
// same id on every retry of one delivery) and X-Toolgate-Signature:
// "v1=" followed by the hex HMAC-SHA256, keyed with the secret, of the
// timestamp, a ".", and the body. A receiver recomputes it, compares in
// constant time, and refuses timestamps more than a few minutes old.

// Signature is the X-Toolgate-Signature value of body sent at timestamp.
func Signature(secret string, timestamp int64, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(strconv.FormatInt(timestamp, 10)))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1=" + hex.EncodeToString(mac.Sum(nil))
}

type delivery struct {
	id        string
	body      []byte
	requester string
}

// notifier delivers webhook bodies one after the other, retrying each with
// backoff; a full queue drops new announcements (logged), never blocks a
// call. Each requester has a share of the queue: one that asks for
// approvals without end fills their share, not everyone's, so that other
// people's approvals are still announced.
type notifier struct {
	hook    *Webhook
	client  *http.Client
	logger  *zap.Logger
	queue   chan delivery
	backoff []time.Duration

	mu     sync.Mutex
	queued map[string]int // announcements waiting in queue, by requester
}

const (
	hookQueue = 1024
	// hookShare is how many of one requester's announcements may wait.
	hookShare = 32
)

func newNotifier(w *Webhook, client *http.Client, logger *zap.Logger) *notifier {
	return &notifier{hook: w, client: client, logger: logger, queue: make(chan delivery, hookQueue), queued: map[string]int{},
		backoff: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second}}
}

type announcement struct {
	Type     string       `json:"type"`
	Delivery string       `json:"delivery"`
	Approval announcedApp `json:"approval"`
}

type announcedApp struct {
	ID         string          `json:"id"`
	URL        string          `json:"url"`
	State      string          `json:"state"`
	Stage      string          `json:"stage"`
	Requester  string          `json:"requester"`
	Service    string          `json:"service"`
	Method     string          `json:"method"`
	Tool       string          `json:"tool,omitempty"`
	Reason     string          `json:"reason,omitempty"`
	DecisionID string          `json:"decision_id"`
	Scopes     []string        `json:"scopes"`
	CreatedAt  time.Time       `json:"created_at"`
	ExpiresAt  time.Time       `json:"expires_at"`
	Arguments  json.RawMessage `json:"arguments,omitempty"`
}

func (n *notifier) announce(a *Approval, pageURL string, withArguments bool, masked []byte) {
	body := announcement{Type: "approval.requested", Delivery: gateway.NewID(), Approval: announcedApp{
		ID: a.ID, URL: pageURL, State: a.State, Stage: a.Stage, Requester: a.Requester, Service: a.Service,
		Method: a.Method, Tool: a.Tool, Reason: a.Reason, DecisionID: a.DecisionID, Scopes: a.Scopes,
		CreatedAt: a.CreatedAt, ExpiresAt: a.ExpiresAt}}
	if withArguments && json.Valid(masked) {
		body.Approval.Arguments = masked
	}
	data, _ := json.Marshal(body)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.queued[a.Requester] >= hookShare {
		n.logger.Warn("approval webhook: too many of this requester's announcements wait; one was dropped (the approval is on the console's queue)",
			zap.String("approval_id", a.ID), zap.String("requester", a.Requester))
		return
	}
	select {
	case n.queue <- delivery{id: body.Delivery, body: data, requester: a.Requester}:
		n.queued[a.Requester]++
	default:
		n.logger.Warn("approval webhook queue full: an announcement was dropped", zap.String("approval_id", a.ID))
	}
}

// taken counts d out of its requester's share.
func (n *notifier) taken(d delivery) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.queued[d.requester]--; n.queued[d.requester] <= 0 {
		delete(n.queued, d.requester)
	}
}

func (n *notifier) run(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case d := <-n.queue:
			n.taken(d)
			n.deliver(done, d)
		}
	}
}

// deliver posts d until the receiver accepts it (2xx), refuses it for good
// (another 4xx than 408 or 429), or the attempts run out.
func (n *notifier) deliver(done <-chan struct{}, d delivery) {
	for attempt := 0; ; attempt++ {
		err := n.post(d)
		if err == nil {
			return
		}
		var final *refusedError
		if errors.As(err, &final) || attempt >= len(n.backoff) {
			n.logger.Warn("approval webhook delivery failed", zap.String("delivery", d.id), zap.Int("attempts", attempt+1), zap.Error(err))
			return
		}
		select {
		case <-done:
			return
		case <-time.After(n.backoff[attempt]):
		}
	}
}

type refusedError struct{ status int }

func (e *refusedError) Error() string {
	return "the receiver refused the delivery (HTTP " + strconv.Itoa(e.status) + ")"
}

func (n *notifier) post(d delivery) error {
	timeout := time.Duration(n.hook.Timeout)
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.hook.URL, bytes.NewReader(d.body))
	if err != nil {
		return &refusedError{}
	}
	ts := now().Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "toolgate")
	req.Header.Set("X-Toolgate-Delivery", d.id)
	req.Header.Set("X-Toolgate-Timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("X-Toolgate-Signature", Signature(n.hook.Secret, ts, d.body))
	resp, err := n.client.Do(req)
	if err != nil {
		return errors.New("the receiver is unreachable or slow")
	}
	resp.Body.Close()
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300:
		return nil
	case s >= 400 && s < 500 && s != http.StatusRequestTimeout && s != http.StatusTooManyRequests:
		return &refusedError{status: s}
	}
	return errors.New("the receiver failed (HTTP " + strconv.Itoa(resp.StatusCode) + ")")
}

func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func jsonStrict(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
