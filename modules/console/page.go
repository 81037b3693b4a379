package console

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/websession"
	"github.com/toolgate/toolgate/modules/gateway"
)

// view is what every page template gets.
type view struct {
	Title  string
	Nav    string              // the navigation entry to mark as current
	Person *websession.Session // nil when nobody is signed in
	Admin  bool
	// PinAdmin: the person may accept changed tool definitions.
	PinAdmin bool
	Notice   *notice
	Data     any
}

// CSRF is the token of the person's forms.
func (v view) CSRF() string {
	if v.Person == nil {
		return ""
	}
	return v.Person.CSRF()
}

// Path is the console's base path, for links.
func (view) Path() string { return gateway.ConsolePath }

// notice is a message at the top of a page.
type notice struct {
	Kind string // "ok", "warn" or "error"
	Text string
	// Detail is a second line, e.g. what to do next.
	Detail string
}

func ok(text string) *notice              { return &notice{Kind: "ok", Text: text} }
func problem(text, detail string) *notice { return &notice{Kind: "error", Text: text, Detail: detail} }

// parsePages parses the console's templates, with their functions.
func parsePages() (*template.Template, error) {
	return template.New("").Funcs(funcs).ParseFS(templateFiles, "templates/*.html")
}

var funcs = template.FuncMap{
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04 UTC")
	},
	"iso": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"short": func(s string) string {
		if len(s) > 12 {
			return s[:12]
		}
		return s
	},
	"join": strings.Join,
	// visible writes the invisible and direction-changing characters of a
	// runner's or an upstream's text as \u escapes.
	"visible": approval.Visible,
	"until": func(t time.Time) string {
		d := time.Until(t)
		switch {
		case d <= 0:
			return "expired"
		case d < time.Minute:
			return "in less than a minute"
		case d < time.Hour:
			return fmt.Sprintf("in %d min", int(d.Round(time.Minute)/time.Minute))
		}
		return fmt.Sprintf("in %d h %d min", int(d/time.Hour), int(d%time.Hour/time.Minute))
	},
}

// render answers with the page template name filled with v.
func (h *Handler) render(w http.ResponseWriter, status int, name string, v view) {
	var buf bytes.Buffer
	if err := h.pages.ExecuteTemplate(&buf, name, v); err != nil {
		h.logger.Error("rendering a console page", zap.String("page", name), zap.Error(err))
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// refuse answers with a page that says what went wrong and what to do.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, status int, title, message string) {
	v := view{Title: title, Notice: &notice{Kind: "error", Text: message}}
	if s, err := h.browsers.FromRequest(r, h.secure(r)); err == nil {
		v.Person, v.Admin, v.PinAdmin = s, h.isAdmin(s), h.pins.IsAdmin(s.Caller())
	}
	h.render(w, status, "message", v)
}

// isAdmin reports whether the person is in an admin group.
func (h *Handler) isAdmin(s *websession.Session) bool {
	for _, g := range s.Groups {
		for _, a := range h.AdminGroups {
			if g == a {
				return true
			}
		}
	}
	return false
}

// page is the view of a signed-in person's page.
func (h *Handler) page(s *websession.Session, title, nav string, data any) view {
	return view{Title: title, Nav: nav, Person: s, Admin: h.isAdmin(s), PinAdmin: h.pins.IsAdmin(s.Caller()), Data: data}
}
