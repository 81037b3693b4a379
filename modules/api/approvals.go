package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/modules/gateway"
)

// approvalView is an approval as the API shows it: the arguments (and a
// withheld result) masked by the policy's data.toolgate.log.mask, never
// raw — and not their digest either, which an approver could match
// against guesses of a masked value (a PIN, a short password) to unmask
// it. The digest stays in the record and the audit log.
type approvalView struct {
	ID                  string          `json:"id"`
	URL                 string          `json:"url"`
	State               string          `json:"state"`
	Stage               string          `json:"stage"`
	Requester           string          `json:"requester"`
	Service             string          `json:"service"`
	Method              string          `json:"method"`
	Tool                string          `json:"tool,omitempty"`
	Arguments           json.RawMessage `json:"arguments,omitempty"`
	Result              json.RawMessage `json:"result,omitempty"`
	Reason              string          `json:"reason,omitempty"`
	DecisionID          string          `json:"decision_id"`
	Revision            string          `json:"revision,omitempty"`
	Approvers           []string        `json:"approvers,omitempty"`
	ApproverGroups      []string        `json:"approver_groups,omitempty"`
	RequesterMayApprove bool            `json:"requester_may_approve"`
	Scopes              []string        `json:"scopes"`
	CreatedAt           time.Time       `json:"created_at"`
	ExpiresAt           time.Time       `json:"expires_at"`
	Scope               string          `json:"scope,omitempty"`
	DecidedBy           string          `json:"decided_by,omitempty"`
	DecidedAt           time.Time       `json:"decided_at,omitzero"`
	Note                string          `json:"note,omitempty"`
	ConsumedAt          time.Time       `json:"consumed_at,omitzero"`
	MayDecide           bool            `json:"may_decide"`
}

func viewApproval(a *approval.Approval, caller *gateway.Caller, base string, c *approval.Contents) approvalView {
	v := approvalView{ID: a.ID, URL: approval.URL(base, a), State: a.Status(), Stage: a.Stage, Requester: a.Requester,
		Service: a.Service, Method: a.Method, Tool: a.Tool, Reason: a.Reason,
		DecisionID: a.DecisionID, Revision: a.Revision, Approvers: a.Approvers, ApproverGroups: a.ApproverGroups,
		RequesterMayApprove: a.RequesterMayApprove, Scopes: a.Scopes, CreatedAt: a.CreatedAt, ExpiresAt: a.ExpiresAt,
		Scope: a.Scope, DecidedBy: a.DecidedBy, DecidedAt: a.DecidedAt, Note: a.Note, ConsumedAt: a.ConsumedAt,
		MayDecide: a.Status() == approval.StatePending && a.MayDecide(caller)}
	if c != nil {
		v.Arguments = c.Masked
		if a.MayDecide(caller) {
			// A withheld result is for those who review it: its
			// requester is the runner's user, whose key the runner holds,
			// so showing it to them would hand the runner what the
			// policy withheld from it.
			v.Result = c.MaskedResult
		}
	}
	return v
}

// approvalsReady answers 404 when this gateway takes no approvals.
func (h *Handler) approvalsReady(w http.ResponseWriter) bool {
	if h.approvals == nil {
		gateway.WriteAPIError(w, http.StatusNotFound, "no_approvals", "this gateway takes no approvals: it has no cipher to keep them")
		return false
	}
	return true
}

// listApprovals: GET /v1/approvals?role=approver|requester&state=… — the
// approvals the caller may decide (role approver, the default: pending
// ones), or the caller's own requests (role requester).
func (h *Handler) listApprovals(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	if !h.approvalsReady(w) {
		return
	}
	q := r.URL.Query()
	state := q.Get("state")
	switch state {
	case "", approval.StatePending, approval.StateApproved, approval.StateDenied, approval.StateConsumed, approval.StateExpired:
	default:
		gateway.WriteAPIError(w, http.StatusBadRequest, "invalid_state",
			"state is pending, approved, denied, consumed or expired, not "+strconv.Quote(state))
		return
	}
	var list []*approval.Approval
	var err error
	switch role := q.Get("role"); role {
	case "", "approver":
		list, err = h.approvals.Decidable(r.Context(), caller)
	case "requester":
		list, err = h.approvals.Store.OfRequester(r.Context(), caller.User)
	default:
		gateway.WriteAPIError(w, http.StatusBadRequest, "invalid_role", "role is approver or requester, not "+strconv.Quote(role))
		return
	}
	if err != nil {
		h.logger.Error("listing approvals", zap.Error(err))
		gateway.WriteAPIError(w, http.StatusServiceUnavailable, "unavailable", "approvals cannot be read right now; try again")
		return
	}
	views := []approvalView{}
	for _, a := range list {
		if state == "" || a.Status() == state {
			views = append(views, viewApproval(a, caller, h.app.BaseURL(r), nil))
		}
	}
	gateway.WriteJSON(w, http.StatusOK, map[string]any{"approvals": views})
}

// visibleApproval returns the approval in the path if caller may see it
// (its requester, or someone who may decide it); anyone else gets 404.
func (h *Handler) visibleApproval(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) *approval.Approval {
	if !h.approvalsReady(w) {
		return nil
	}
	a, err := h.approvals.Store.Get(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, approval.ErrNotFound) || (err == nil && !a.Visible(caller)):
		gateway.WriteAPIError(w, http.StatusNotFound, "not_found", "no such approval")
		return nil
	case err != nil:
		h.logger.Error("reading an approval", zap.Error(err))
		gateway.WriteAPIError(w, http.StatusServiceUnavailable, "unavailable", "approvals cannot be read right now; try again")
		return nil
	}
	return a
}

// getApproval: GET /v1/approvals/{id}, with the masked arguments.
func (h *Handler) getApproval(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	a := h.visibleApproval(w, r, caller)
	if a == nil {
		return
	}
	var contents *approval.Contents
	if a.HasContents() {
		c, err := h.approvals.Store.Open(r.Context(), a)
		if err != nil {
			h.logger.Error("opening an approval", zap.Error(err))
			gateway.WriteAPIError(w, http.StatusServiceUnavailable, "unavailable", "the approval cannot be decrypted right now; try again")
			return
		}
		contents = &c
	}
	gateway.WriteJSON(w, http.StatusOK, viewApproval(a, caller, h.app.BaseURL(r), contents))
}

// decideApproval: POST /v1/approvals/{id}/approve {"scope": …, "note": …}
// and POST /v1/approvals/{id}/deny {"note": …}.
func (h *Handler) decideApproval(approve bool) func(http.ResponseWriter, *http.Request, *gateway.Caller) {
	return func(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
		a := h.visibleApproval(w, r, caller)
		if a == nil {
			return
		}
		var body struct {
			Scope string `json:"scope"`
			Note  string `json:"note"`
		}
		if r.ContentLength != 0 && !readJSON(w, r, &body) {
			return
		}
		if !approve && body.Scope != "" {
			gateway.WriteAPIError(w, http.StatusBadRequest, "invalid_body", "a denial has no scope")
			return
		}
		decided, err := h.approvals.Decide(r.Context(), a.ID, caller, approve, body.Scope, body.Note)
		if err != nil {
			status, code := decideError(err)
			message := err.Error()
			if status == http.StatusServiceUnavailable {
				// The storage's or cipher's own words (hosts, ports) go to
				// the log, not to the caller.
				h.logger.Error("deciding an approval", zap.Error(err))
				message = "approvals are unavailable right now; retry later"
			}
			gateway.WriteAPIError(w, status, code, message)
			return
		}
		gateway.WriteJSON(w, http.StatusOK, viewApproval(decided, caller, h.app.BaseURL(r), nil))
	}
}

// decideError maps a refused decision to its HTTP status.
func decideError(err error) (int, string) {
	switch {
	case errors.Is(err, approval.ErrForbidden):
		return http.StatusForbidden, "forbidden"
	case errors.Is(err, approval.ErrDecided), errors.Is(err, approval.ErrExpired):
		return http.StatusConflict, "conflict"
	case errors.Is(err, approval.ErrScope), errors.Is(err, approval.ErrNote):
		return http.StatusBadRequest, "invalid_body"
	case errors.Is(err, approval.ErrNotFound):
		return http.StatusNotFound, "not_found"
	}
	return http.StatusServiceUnavailable, "unavailable"
}
