package console

import (
	"errors"
	"net/http"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/account"
	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/websession"
	"github.com/toolgate/toolgate/modules/gateway"
)

// sessionsData is what the Sessions page shows.
type sessionsData struct {
	Sessions []gateway.SessionSummary
	Services []account.Entry
	// Created is a session just made, with its id: shown this once.
	Created *createdSession
}

// createdSession is a new session and what clients need to use it.
type createdSession struct {
	ID        string
	Header    string // the session header's name
	Endpoints []endpoint
}

// endpoint is one service of a new session, as a client reaches it.
type endpoint struct {
	Service string
	Name    string
	URL     string
}

func (h *Handler) sessionsPage(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	h.showSessions(w, r, s, nil, nil, http.StatusOK)
}

func (h *Handler) showSessions(w http.ResponseWriter, r *http.Request, s *websession.Session, n *notice, created *createdSession, status int) {
	data := sessionsData{Services: account.Catalog(r.Context(), h.app, s.Caller()), Created: created}
	list, err := account.Sessions(r.Context(), h.app, s.Caller())
	if err != nil && n == nil {
		n = problem(err.Error(), "")
	}
	data.Sessions = list
	v := h.page(s, "Sessions", "sessions", data)
	v.Notice = n
	h.render(w, status, "sessions", v)
}

func (h *Handler) createSession(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	_ = r.ParseForm()
	chosen := r.PostForm["service"]
	sess, err := account.CreateSession(r.Context(), h.app, s.Caller(), chosen)
	if err != nil {
		var refusal *account.Error
		msg := "The session could not be created."
		if errors.As(err, &refusal) {
			msg = refusal.Message
			if refusal.Code == "invalid_body" {
				msg = "Choose at least one service for the session."
			}
		}
		h.showSessions(w, r, s, problem(msg, ""), nil, http.StatusBadRequest)
		return
	}
	h.logger.Info("toolgate session created in the console", zap.String("user", s.User), zap.Strings("services", sess.Services))
	created := &createdSession{ID: sess.ID, Header: h.app.SessionHeaderName()}
	base := h.app.BaseURL(r)
	for _, id := range sess.Services {
		svc := h.app.Registry().Lookup(id)
		created.Endpoints = append(created.Endpoints, endpoint{Service: id, Name: name(svc), URL: base + "/v1/mcp/" + id})
	}
	n := ok("Session created. Copy its setup now: toolgate keeps only a fingerprint of the session id and cannot show it again.")
	h.showSessions(w, r, s, n, created, http.StatusCreated)
}

func (h *Handler) endSession(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	if err := account.EndSession(r.Context(), h.app, s.Caller(), r.PathValue("ref")); err != nil {
		h.showSessions(w, r, s, problem(err.Error(), ""), nil, http.StatusServiceUnavailable)
		return
	}
	h.showSessions(w, r, s, ok("The session is ended: runners using it are refused from now on."), nil, http.StatusOK)
}

// activityData is what the Activity page shows.
type activityData struct {
	Decisions []gateway.DecisionRecord
	Everyone  bool   // an admin's view of every person's decisions
	User      string // an admin's filter
	// Shown is User as the page shows it: from a link anyone can write,
	// with nothing hidden or reordered, and bounded.
	Shown string
	Limit int
}

const activityLimit = 200

func (h *Handler) activityPage(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	data := activityData{Limit: activityLimit}
	var err error
	admin := h.isAdmin(s)
	switch filter := r.URL.Query().Get("user"); {
	case admin && filter != "":
		data.User, data.Shown = filter, approval.VisibleCut(filter, maxShownName)
		data.Decisions, err = h.activity.Recent(r.Context(), filter, activityLimit)
	case admin && r.URL.Query().Get("everyone") != "":
		data.Everyone = true
		data.Decisions, err = h.activity.RecentAll(r.Context(), activityLimit)
	default:
		data.Decisions, err = h.activity.Recent(r.Context(), s.User, activityLimit)
	}
	v := h.page(s, "Activity", "activity", data)
	if err != nil {
		h.logger.Error("reading the activity record", zap.Error(err))
		v.Notice = problem("toolgate cannot read the activity record right now (its storage is unavailable).", "Try again in a moment.")
	}
	h.render(w, http.StatusOK, "activity", v)
}
