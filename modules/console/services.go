package console

import (
	"context"
	"errors"
	"net/http"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/account"
	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/websession"
	"github.com/toolgate/toolgate/modules/gateway"
)

// servicesData is what the Services page shows.
type servicesData struct {
	Services []account.Entry
	// Result is the outcome of a connection test, for the service Tested.
	Tested string
	Result *account.TestResult
}

func (h *Handler) servicesPage(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	h.showServices(w, r, s, nil, servicesData{})
}

func (h *Handler) showServices(w http.ResponseWriter, r *http.Request, s *websession.Session, n *notice, data servicesData) {
	data.Services = account.Catalog(r.Context(), h.app, s.Caller())
	v := h.page(s, "Services", "services", data)
	v.Notice = n
	h.render(w, http.StatusOK, "services", v)
}

// service returns the service in the path if the person may use it, or
// answers with a page saying it does not exist.
func (h *Handler) service(w http.ResponseWriter, r *http.Request, s *websession.Session) *gateway.Service {
	svc, err := account.Service(h.app, s.Caller(), r.PathValue("service"))
	if err != nil {
		h.unknownService(w, r)
		return nil
	}
	return svc
}

func (h *Handler) unknownService(w http.ResponseWriter, r *http.Request) {
	h.refuse(w, r, http.StatusNotFound, "Unknown service", "There is no service "+approval.VisibleCut(r.PathValue("service"), maxShownName)+" you may use here.")
}

func name(svc *gateway.Service) string {
	if svc.Title != "" {
		return svc.Title
	}
	return svc.ID
}

// failed shows a refusal from package account on the Services page.
func (h *Handler) failed(w http.ResponseWriter, r *http.Request, s *websession.Session, err error) {
	var refusal *account.Error
	if !errors.As(err, &refusal) {
		refusal = account.Unavailable("something went wrong")
	}
	h.showServices(w, r, s, problem(refusal.Message, ""), servicesData{})
}

func (h *Handler) testService(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	svc := h.service(w, r, s)
	if svc == nil {
		return
	}
	res := account.Test(r, h.app, s.Caller(), svc)
	n := ok(name(svc) + " answered: your credential works.")
	if !res.OK {
		n = problem(name(svc)+" test failed: "+res.Error+".", testAdvice(res))
	}
	h.showServices(w, r, s, n, servicesData{Tested: svc.ID, Result: &res})
}

func testAdvice(res account.TestResult) string {
	switch {
	case res.NeedsSignIn:
		return "Connect the service again."
	case res.Retryable:
		return "This may pass; try again in a moment."
	}
	return "If it keeps failing, tell the gateway's administrator."
}

func (h *Handler) disconnect(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	svc, err := account.ServiceToForget(r.Context(), h.app, s.Caller(), r.PathValue("service"))
	if err != nil {
		h.unknownService(w, r)
		return
	}
	notRevoked, err := account.Disconnect(r.Context(), h.app, s.Caller(), svc)
	if err != nil {
		h.failed(w, r, s, err)
		return
	}
	h.logger.Info("disconnected in the console", zap.String("service", svc.ID), zap.String("user", s.User))
	done := ok(name(svc) + " is disconnected: toolgate no longer holds your credential for it.")
	if notRevoked != "" {
		done = &notice{Kind: "warn", Text: done.Text, Detail: notRevoked}
	}
	h.showServices(w, r, s, done, servicesData{})
}

func (h *Handler) storeToken(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	svc := h.service(w, r, s)
	if svc == nil {
		return
	}
	if err := account.StoreToken(r.Context(), h.app, s.Caller(), svc, r.PostFormValue("token")); err != nil {
		h.failed(w, r, s, err)
		return
	}
	h.logger.Info("personal token stored in the console", zap.String("service", svc.ID), zap.String("user", s.User))
	h.showServices(w, r, s, ok("Your token for "+name(svc)+" is stored, encrypted."), servicesData{})
}

// connectData is what the connect page shows.
type connectData struct {
	Service *account.Entry
	// Other is the person a connect link was made for, when that is not
	// who is signed in here.
	Other string
	// Replace is set when a connection exists already.
	Replace bool
}

// connectPage is where connect links lead: it checks the link is for the
// person signed in here, and asks them to confirm before anything starts.
func (h *Handler) connectPage(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	svc := h.service(w, r, s)
	if svc == nil {
		return
	}
	entry := account.CatalogEntry(r.Context(), h.app, s.Caller(), svc)
	data := connectData{Service: &entry, Replace: entry.Connection != nil}
	status := http.StatusOK
	if want := r.URL.Query().Get("for"); want != "" && want != s.User {
		data.Other, status = approval.VisibleCut(want, maxShownName), http.StatusForbidden // from a link anyone can write
	}
	if !entry.Personal() {
		h.refuse(w, r, http.StatusNotFound, "Nothing to connect", name(svc)+" uses a credential toolgate holds for everyone; there is nothing to connect.")
		return
	}
	h.render(w, status, "connect", h.page(s, "Connect "+entry.Name(), "services", data))
}

// connect starts connecting an oauth service in this browser, once the
// person confirmed: to the provider, and back to the callback, which
// completes only in this browser sign-in.
func (h *Handler) connect(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	svc := h.service(w, r, s)
	if svc == nil {
		return
	}
	if svc.Auth.Kind != gateway.AuthOAuth {
		h.refuse(w, r, http.StatusBadRequest, "Nothing to start", name(svc)+" takes a personal token: store it on the Services page.")
		return
	}
	u, err := h.app.AuthorizeURL(context.WithoutCancel(r.Context()), svc, s.Browser())
	if err != nil {
		h.logger.Error("starting an oauth connect", zap.String("service", svc.ID), zap.Error(err))
		h.refuse(w, r, http.StatusServiceUnavailable, "Not started", "toolgate could not start connecting "+name(svc)+" because a service it needs is unavailable. Try again in a moment.")
		return
	}
	http.Redirect(w, r, u, http.StatusSeeOther)
}
