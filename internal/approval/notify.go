package approval

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/gateway"
)

// The webhook body announcing a pending approval:
//
//	{"type": "approval.requested", "delivery": "<id>", "approval": {
//	  "id": …, "url": …, "state": "pending", "stage": "request", "requester": …,
//	  "service": …, "method": …, "tool": …, "reason": …, "decision_id": …,
//	  "scopes": […], "created_at": …, "expires_at": …,
//	  "approvers": […], "approver_groups": […], "requester_may_approve": …, "in_band": …,
//	  "arguments": {…}}}          (only with include_arguments; masked)
//
// approvers, approver_groups, requester_may_approve and in_band say who
// may decide (and so see) the approval: a receiver posting to a channel
// wider than them routes by them. The reason and the arguments are
// written with invisible characters escaped (Visible), as the console shows
// them, and each is cut past maxAnnounced bytes ("arguments_truncated":
// true stands for arguments past it): the page has the rest.
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
	approval  string
	expires   time.Time // the approval's: an announcement of one over is not sent
	arguments bool      // the body carries arguments (or says they were cut)
	attempts  int       // made so far
	due       time.Time // of the next attempt, for a retry
}

// notifier delivers webhook bodies, retrying each with backoff; a full
// queue drops new announcements (logged), never blocks a call. Each
// requester has a share of the queue (counting their deliveries waiting
// for a retry): one that asks for approvals without end fills their
// share, not everyone's. A delivery waiting for its retry holds nothing
// up: new announcements go first, so a receiver failing one person's
// deliveries delays another's by one attempt each, not by their backoff.
type notifier struct {
	hook    *Webhook
	client  *http.Client
	logger  *zap.Logger
	queue   chan delivery
	backoff []time.Duration

	mu      sync.Mutex
	queued  map[string]int // announcements waiting (queued or for a retry), by requester
	waiting int            // all of them
}

const (
	hookQueue = 1024
	// hookShare is how many of one requester's announcements may wait.
	hookShare = 32
	// maxAnnounced bounds the reason and the arguments an announcement
	// carries (a runner's arguments may be megabytes; chat tools refuse
	// such bodies, and the queue would hold them all).
	maxAnnounced = 16 << 10
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
	ID                  string          `json:"id"`
	URL                 string          `json:"url"`
	State               string          `json:"state"`
	Stage               string          `json:"stage"`
	Requester           string          `json:"requester"`
	Service             string          `json:"service"`
	Method              string          `json:"method"`
	Tool                string          `json:"tool,omitempty"`
	Reason              string          `json:"reason,omitempty"`
	DecisionID          string          `json:"decision_id"`
	Scopes              []string        `json:"scopes"`
	CreatedAt           time.Time       `json:"created_at"`
	ExpiresAt           time.Time       `json:"expires_at"`
	Approvers           []string        `json:"approvers"`
	ApproverGroups      []string        `json:"approver_groups"`
	RequesterMayApprove bool            `json:"requester_may_approve"`
	InBand              bool            `json:"in_band"`
	Arguments           json.RawMessage `json:"arguments,omitempty"`
	ArgumentsTruncated  bool            `json:"arguments_truncated,omitempty"`
}

func (n *notifier) announce(a *Approval, pageURL string, withArguments bool, masked []byte) {
	body := announcement{Type: "approval.requested", Delivery: gateway.NewID(), Approval: announcedApp{
		ID: a.ID, URL: pageURL, State: a.State, Stage: a.Stage, Requester: a.Requester, Service: a.Service,
		Method: a.Method, Tool: a.Tool, Reason: VisibleCut(a.Reason, maxAnnounced), DecisionID: a.DecisionID, Scopes: a.Scopes,
		CreatedAt: a.CreatedAt, ExpiresAt: a.ExpiresAt, Approvers: nonNil(a.Approvers), ApproverGroups: nonNil(a.ApproverGroups),
		RequesterMayApprove: a.RequesterMayApprove, InBand: a.InBand}}
	switch {
	case !withArguments || !json.Valid(masked):
	case len(masked) > maxAnnounced:
		body.Approval.ArgumentsTruncated = true
	default:
		body.Approval.Arguments = json.RawMessage(Visible(string(masked)))
	}
	data, _ := json.Marshal(body)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.queued[a.Requester] >= hookShare {
		n.logger.Warn("approval webhook: too many of this requester's announcements wait; one was dropped (the approval is on the console's queue)",
			zap.String("approval_id", a.ID), zap.String("requester", a.Requester))
		return
	}
	if n.waiting >= hookQueue {
		// Retries wait outside the queue: counted here, so that they too
		// are bounded.
		n.logger.Warn("approval webhook queue full: an announcement was dropped", zap.String("approval_id", a.ID))
		return
	}
	n.queue <- delivery{id: body.Delivery, body: data, requester: a.Requester, approval: a.ID, expires: a.ExpiresAt, // room: waiting < hookQueue
		arguments: body.Approval.Arguments != nil || body.Approval.ArgumentsTruncated}
	n.queued[a.Requester]++
	n.waiting++
}

// cut is s cut to at most n bytes, at a character's start, marked "…"
// when cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// finished counts d out of its requester's share.
func (n *notifier) finished(d delivery) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.queued[d.requester]--; n.queued[d.requester] <= 0 {
		delete(n.queued, d.requester)
	}
	n.waiting--
}

// start registers the notifier as the one of its URL in the
// configuration starting (see handOver) and delivers until done.
func (n *notifier) start(done <-chan struct{}) {
	handedOver.Lock()
	handedOver.running[n.hook.URL]++
	handedOver.Unlock()
	go n.run(done)
}

// run delivers until done: new announcements first, then the retries
// that are due. What is left when done closes (a configuration reload, the
// gateway stopping) is handed over to a notifier of the same webhook URL
// in the configuration in force, if there is one (handOff).
func (n *notifier) run(done <-chan struct{}) {
	var retries []delivery // by due time
	for {
		left, more := takeOver(n.hook.URL)
		for _, d := range left {
			retries = n.adopt(d, retries)
		}
		select {
		case d := <-n.queue:
			retries = n.attempt(d, retries)
			continue
		default:
		}
		var due <-chan time.Time
		if len(retries) > 0 {
			due = time.After(time.Until(retries[0].due))
		}
		select {
		case <-done:
			n.handOff(retries)
			return
		case <-more:
		case d := <-n.queue:
			retries = n.attempt(d, retries)
		case <-due:
			d := retries[0]
			retries = n.attempt(d, retries[1:])
		}
	}
}

// handedOver holds what notifiers left undelivered when they stopped, by
// webhook URL, for a notifier of the same URL in the configuration in
// force: Caddy starts the new configuration before it stops the old one,
// so that notifier runs already (running counts them, from start) and is
// woken (ready) to take them. What no running notifier posts to is
// dropped at once: a URL a reload removed (a rotated URL) keeps nothing.
var handedOver = struct {
	sync.Mutex
	byURL   map[string][]delivery
	running map[string]int
	ready   chan struct{} // closed, and replaced, when some are handed over
}{byURL: map[string][]delivery{}, running: map[string]int{}, ready: make(chan struct{})}

// handOver stops counting a notifier of url as running and leaves left
// for another of url that runs, at most hookQueue of them waiting in all;
// it returns how many it kept.
func handOver(url string, left []delivery) int {
	h := &handedOver
	h.Lock()
	defer h.Unlock()
	if h.running[url]--; h.running[url] <= 0 {
		delete(h.running, url)
		return 0
	}
	kept := min(max(hookQueue-len(h.byURL[url]), 0), len(left))
	if kept > 0 {
		h.byURL[url] = append(h.byURL[url], left[:kept]...)
		close(h.ready)
		h.ready = make(chan struct{})
	}
	return kept
}

// takeOver takes what was handed over for url, and returns a channel
// closed when more is.
func takeOver(url string) ([]delivery, <-chan struct{}) {
	h := &handedOver
	h.Lock()
	defer h.Unlock()
	left := h.byURL[url]
	delete(h.byURL, url)
	return left, h.ready
}

// adopt counts d, handed over by the previous configuration's notifier,
// as this one's, due now (its attempts so far count toward its last),
// and written as this configuration says: without arguments unless it
// includes them.
func (n *notifier) adopt(d delivery, retries []delivery) []delivery {
	if d.arguments && !n.hook.IncludeArguments {
		var body announcement
		if json.Unmarshal(d.body, &body) != nil {
			return retries
		}
		body.Approval.Arguments, body.Approval.ArgumentsTruncated = nil, false
		d.body, _ = json.Marshal(body)
		d.arguments = false
	}
	n.mu.Lock()
	n.queued[d.requester]++
	n.waiting++
	n.mu.Unlock()
	d.due = now()
	return slices.Insert(retries, 0, d)
}

// attempt posts d once; one to try again joins retries, in due order.
// An announcement of an approval that expired meanwhile is not sent.
func (n *notifier) attempt(d delivery, retries []delivery) []delivery {
	if !d.expires.IsZero() && !now().Before(d.expires) {
		n.finished(d)
		return retries
	}
	err := n.post(d)
	d.attempts++
	if err == nil {
		n.finished(d)
		return retries
	}
	var final *refusedError
	if errors.As(err, &final) || d.attempts > len(n.backoff) {
		n.logger.Warn("approval webhook delivery failed", zap.String("delivery", d.id), zap.String("approval_id", d.approval),
			zap.Int("attempts", d.attempts), zap.Error(err))
		n.finished(d)
		return retries
	}
	d.due = now().Add(n.backoff[d.attempts-1])
	i := slices.IndexFunc(retries, func(r delivery) bool { return r.due.After(d.due) })
	if i < 0 {
		return append(retries, d)
	}
	return slices.Insert(retries, i, d)
}

// handOff hands the announcements left undelivered when the notifier
// stops (its own, and any handed to it it had not taken yet) to a
// notifier of the same URL in the configuration in force (handOver), and
// logs each: handed over, or dropped.
func (n *notifier) handOff(retries []delivery) {
	for len(n.queue) > 0 { // this goroutine alone takes from the queue
		retries = append(retries, <-n.queue)
	}
	left, _ := takeOver(n.hook.URL)
	retries = append(retries, left...)
	kept := handOver(n.hook.URL, retries)
	for i, d := range retries {
		if i < kept {
			n.logger.Info("approval webhook: an announcement not yet delivered is handed to the webhook of the configuration in force",
				zap.String("approval_id", d.approval), zap.String("delivery", d.id))
			continue
		}
		n.logger.Warn("approval webhook: the gateway stopped, or the configuration in force has no webhook of this URL, before this announcement was delivered; the approval is on the console's queue",
			zap.String("approval_id", d.approval), zap.String("delivery", d.id))
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

func jsonStrict(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
