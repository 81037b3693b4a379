package approval

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Elicitations: a call held for its approval (approval_wait) asks the
// runner's client to show the approval page (URL mode), or, for an
// in_band approval, to let its person approve the call right there (form
// mode). The client's answer comes back as a JSON-RPC response on any
// replica; its id says which approval it is about, and the answer is
// taken only from the requester's own toolgate session.

// elicitationPrefix starts the ids of the elicitations toolgate sends.
const elicitationPrefix = "toolgate-approval:"

// Elicitation modes.
const (
	ModeURL  = "url"
	ModeForm = "form"
)

// ElicitationID is the id of the elicitation asking about a in mode.
func ElicitationID(a *Approval, mode string) string {
	return elicitationPrefix + mode + ":" + a.ID
}

// errNoElicitation refuses an answer to an elicitation toolgate did not
// send to this session.
var errNoElicitation = errors.New("this response answers no pending request of this MCP session")

// FormSchema is the requested schema of an in-band approval: one yes/no.
var FormSchema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"approve": map[string]any{"type": "boolean", "title": "Approve this call",
			"description": "Yes runs the call once with exactly these arguments; no denies it."},
	},
	"required": []string{"approve"},
}

// clientAnswer takes the client's answer to an elicitation: for a URL
// one, nothing follows (the approval page decides); for an in-band form,
// accepting with approve decides the approval as its requester, once.
func (m *Manager) clientAnswer(ctx context.Context, call *gateway.Call, answer mcpmsg.Message) error {
	var id string
	_ = json.Unmarshal(answer.ID, &id)
	mode, approvalID, _ := strings.Cut(strings.TrimPrefix(id, elicitationPrefix), ":")
	if !validID(approvalID) || call.Session == nil {
		return errNoElicitation
	}
	a, err := m.Store.Get(ctx, approvalID)
	if errors.Is(err, ErrNotFound) {
		return errNoElicitation
	}
	if err != nil {
		return errors.New("approvals cannot be read right now; answer again later")
	}
	if a.Requester != call.Caller.User || a.Session != gateway.SessionRef(call.Session.ID) {
		return errNoElicitation
	}
	switch {
	case mode == ModeURL:
		return nil
	case mode != ModeForm || !a.InBand:
		return errNoElicitation
	case len(answer.Error) > 0:
		return nil // the client could not ask; the approval stays pending
	}
	var res struct {
		Action  string `json:"action"`
		Content struct {
			Approve *bool `json:"approve"`
		} `json:"content"`
	}
	if json.Unmarshal(answer.Result, &res) != nil {
		return errors.New("the elicitation result is not an object")
	}
	var approve bool
	switch {
	case res.Action == "accept" && res.Content.Approve != nil:
		approve = *res.Content.Approve
	case res.Action == "accept":
		return errors.New("the elicitation result has no approve answer")
	case res.Action == "decline":
	default: // cancel: the person did not decide
		return nil
	}
	note := "denied in the client (in-band)"
	if approve {
		note = "approved in the client (in-band)"
	}
	scope := ScopeOnce // the narrowest the policy offers
	if !slices.Contains(a.Scopes, scope) {
		scope = a.Scopes[0]
	}
	_, err = m.Decide(ctx, a.ID, call.Caller, approve, scope, note)
	switch {
	case err == nil, errors.Is(err, ErrDecided), errors.Is(err, ErrExpired):
		return nil // decided meanwhile, or too late: the held call says so
	case errors.Is(err, ErrForbidden):
		return errNoElicitation
	}
	return errors.New("the approval cannot be decided right now: " + err.Error())
}

// maxWatches bounds the decisions watched at once (WatchDecision), and
// maxWatchesPerRequester those of one requester's approvals, so that one
// person's flood of asks cannot take every place.
const (
	maxWatches             = 10000
	maxWatchesPerRequester = 100
)

// WatchDecision calls decided once the approval a is decided, approved or
// denied, on any replica: it reads the approval again when a replica
// decides it (Wait) and at least every Poll(poll). It gives up, without calling, when
// ctx ends, the app stops, or the approval expires or goes. key names the
// watch: a second watch under a key already watched is not started (a
// runner asking again about the same approval). Past maxWatches at once,
// or maxWatchesPerRequester of a's requester, nothing more is watched; it
// reports whether a watch started.
func (m *Manager) WatchDecision(ctx context.Context, key string, a *Approval, poll time.Duration, decided func(*Approval)) bool {
	m.mu.Lock()
	if _, dup := m.watches[key]; dup || len(m.watches) >= maxWatches || m.watching[a.Requester] >= maxWatchesPerRequester {
		m.mu.Unlock()
		return false
	}
	m.watches[key] = struct{}{}
	m.watching[a.Requester]++
	m.mu.Unlock()
	ctx, cancel := context.WithDeadline(ctx, a.ExpiresAt)
	go func() {
		defer func() {
			cancel()
			m.mu.Lock()
			delete(m.watches, key)
			if m.watching[a.Requester]--; m.watching[a.Requester] <= 0 {
				delete(m.watching, a.Requester)
			}
			m.mu.Unlock()
		}()
		for ctx.Err() == nil {
			m.Wait(ctx, a.ID, m.Poll(poll))
			select {
			case <-m.app.Done():
				return
			default:
			}
			if ctx.Err() != nil {
				return
			}
			got, err := m.Store.Get(ctx, a.ID)
			switch {
			case errors.Is(err, ErrNotFound):
				return
			case err != nil:
				m.logger.Debug("watching an approval", zap.String("approval_id", a.ID), zap.Error(err))
			case got.Status() == StateApproved || got.Status() == StateDenied || got.State == StateConsumed:
				decided(got)
				return
			case got.Status() != StatePending:
				return
			}
		}
	}()
	return true
}
