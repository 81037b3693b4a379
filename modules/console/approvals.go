package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/websession"
)

// approvalsData is what the Approvals page shows.
type approvalsData struct {
	Decidable []*approval.Approval // pending, and the person may decide them
	Mine      []*approval.Approval // the person's own requests
}

// approvalData is what one approval's page shows.
type approvalData struct {
	A         *approval.Approval
	Arguments string // masked, indented
	Result    string // a withheld result, masked, indented
	MayDecide bool
}

func (h *Handler) approvalsPage(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	h.showApprovals(w, r, s, nil, http.StatusOK)
}

func (h *Handler) showApprovals(w http.ResponseWriter, r *http.Request, s *websession.Session, n *notice, status int) {
	v := h.page(s, "Approvals", "approvals", nil)
	v.Notice = n
	if h.approvals == nil {
		v.Notice = problem("This gateway takes no approvals: it has no cipher to keep them.", "An administrator must configure one.")
		h.render(w, status, "approvals", v)
		return
	}
	var data approvalsData
	var err error
	if data.Decidable, err = h.approvals.Decidable(r.Context(), s.Caller()); err == nil {
		data.Mine, err = h.approvals.Store.OfRequester(r.Context(), s.User)
	}
	if err != nil {
		h.logger.Error("listing approvals", zap.Error(err))
		v.Notice = problem("toolgate cannot read approvals right now (its storage is unavailable).", "Try again in a moment.")
	}
	v.Data = data
	h.render(w, status, "approvals", v)
}

// approvalPage is the page an approval_url leads to.
func (h *Handler) approvalPage(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	h.showApproval(w, r, s, r.PathValue("id"), nil, http.StatusOK)
}

func (h *Handler) showApproval(w http.ResponseWriter, r *http.Request, s *websession.Session, id string, n *notice, status int) {
	if h.approvals == nil {
		h.refuse(w, r, http.StatusNotFound, "No approvals", "This gateway takes no approvals: it has no cipher to keep them.")
		return
	}
	a, err := h.approvals.Store.Get(r.Context(), id)
	if errors.Is(err, approval.ErrNotFound) || (err == nil && !a.Visible(s.Caller())) {
		h.refuse(w, r, http.StatusNotFound, "No such approval", "There is no approval here that you may see. It may have been removed after it expired or was decided.")
		return
	}
	if err != nil {
		h.logger.Error("reading an approval", zap.Error(err))
		h.refuse(w, r, http.StatusServiceUnavailable, "Unavailable", "toolgate cannot read approvals right now (its storage is unavailable). Try again in a moment.")
		return
	}
	data := approvalData{A: a, MayDecide: a.Status() == approval.StatePending && a.MayDecide(s.Caller())}
	if a.HasContents() {
		c, err := h.approvals.Store.Open(r.Context(), a)
		if err != nil {
			h.logger.Error("opening an approval", zap.Error(err))
			n = problem("toolgate cannot decrypt this approval's arguments right now (its cipher is unavailable).", "Try again in a moment; decide only once you can see what you approve.")
			data.MayDecide = false
		} else {
			data.Arguments = indent(c.Masked)
			if a.MayDecide(s.Caller()) { // a withheld result is for its reviewers (see toolgate_api)
				data.Result = indent(c.MaskedResult)
			}
		}
	}
	v := h.page(s, "Approval", "approvals", data)
	v.Notice = n
	h.render(w, status, "approval", v)
}

// indent lays out JSON for reading, changing nothing of its values (a
// number keeps every digit). Invisible and bidirectional control
// characters (every default-ignorable code point: approval.Visible), which
// would hide text or show it reordered, are written as \u escapes: the
// same JSON, shown as it is; bytes that are not UTF-8 as U+FFFD.
func indent(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var out bytes.Buffer
	text := string(raw)
	if json.Indent(&out, raw, "", "  ") == nil {
		text = out.String()
	} else {
		// Not JSON (a damaged record): shown as it is, a carriage return
		// written as \r (a browser would break the line at one).
		text = strings.ReplaceAll(text, "\r", `\r`)
	}
	// Bytes that are not UTF-8 are shown as U+FFFD, as the browser would
	// show them, and compared as such (see lineDiff).
	return approval.Visible(strings.ToValidUTF8(text, "\uFFFD"))
}

// decide approves (with the scope chosen) or denies one approval.
func (h *Handler) decide(approve bool) signedInHandler {
	return func(w http.ResponseWriter, r *http.Request, s *websession.Session) {
		if h.approvals == nil {
			h.refuse(w, r, http.StatusNotFound, "No approvals", "This gateway takes no approvals.")
			return
		}
		id := r.PathValue("id")
		scope := ""
		if approve {
			scope = r.PostFormValue("scope")
		}
		a, err := h.approvals.Decide(r.Context(), id, s.Caller(), approve, scope, strings.TrimSpace(r.PostFormValue("note")))
		if err != nil {
			status, text := decisionProblem(err)
			if status == http.StatusServiceUnavailable {
				h.logger.Error("deciding an approval", zap.Error(err))
			}
			h.showApproval(w, r, s, id, problem(text, ""), status)
			return
		}
		text := "Denied. The runner's retry is answered with your denial."
		if approve {
			text = "Approved for " + scopeName(a.Scope) + ". The runner may retry the call now."
		}
		h.showApproval(w, r, s, id, ok(text), http.StatusOK)
	}
}

// bulk approves (for once only) or denies several approvals from the
// queue.
func (h *Handler) bulk(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	if h.approvals == nil {
		h.refuse(w, r, http.StatusNotFound, "No approvals", "This gateway takes no approvals.")
		return
	}
	_ = r.ParseForm()
	ids := r.PostForm["id"]
	approve := r.PostFormValue("action") == "approve"
	if len(ids) == 0 || len(ids) > 100 {
		h.showApprovals(w, r, s, problem("Choose between 1 and 100 approvals first.", ""), http.StatusBadRequest)
		return
	}
	done, failed := 0, []string{}
	for _, id := range ids {
		scope := ""
		if approve {
			scope = approval.ScopeOnce // a bulk approval never reaches further than one call each
		}
		if _, err := h.approvals.Decide(r.Context(), id, s.Caller(), approve, scope, strings.TrimSpace(r.PostFormValue("note"))); err != nil {
			_, text := decisionProblem(err)
			failed = append(failed, shortID(id)+": "+text)
			continue
		}
		done++
	}
	verb := "Denied"
	if approve {
		verb = "Approved (each for one call)"
	}
	n := ok(verb + ": " + strconv.Itoa(done) + ".")
	if len(failed) > 0 {
		n = problem(verb+": "+strconv.Itoa(done)+". Not decided: "+strings.Join(failed, "; "), "")
	}
	h.showApprovals(w, r, s, n, http.StatusOK)
}

func decisionProblem(err error) (int, string) {
	switch {
	case errors.Is(err, approval.ErrForbidden):
		return http.StatusForbidden, "You may not decide this approval."
	case errors.Is(err, approval.ErrDecided):
		return http.StatusConflict, "This approval was already decided."
	case errors.Is(err, approval.ErrExpired):
		return http.StatusConflict, "This approval has expired; the runner must ask again."
	case errors.Is(err, approval.ErrScope):
		return http.StatusBadRequest, "The policy does not offer that scope for this approval."
	case errors.Is(err, approval.ErrNote):
		return http.StatusBadRequest, err.Error() + "."
	case errors.Is(err, approval.ErrNotFound):
		return http.StatusNotFound, "There is no such approval."
	}
	return http.StatusServiceUnavailable, "toolgate cannot store the decision right now (its storage is unavailable). Try again in a moment."
}

func scopeName(scope string) string {
	switch scope {
	case approval.ScopeOnce:
		return "one identical call"
	case approval.ScopeSession:
		return "identical calls in that session"
	case approval.ScopeTool:
		return "any call of that tool in that session"
	}
	return scope
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
