package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/toolpin"
	"github.com/toolgate/toolgate/internal/websession"
	"github.com/toolgate/toolgate/modules/gateway"
)

// toolChange is a changed tool definition as the Tools page shows it.
type toolChange struct {
	*toolpin.Record
	Pinned     string     // the digest the tool is pinned to
	Registry   bool       // the registry pins it: only a new pin line accepts a change
	Definition string     // the new definition, indented, invisible characters escaped
	Before     string     // the pinned one, when known, the same way
	Diff       []diffLine // Before to Definition, line by line, when Before is known
	Uncompared bool       // Before is known, but the two were not compared (see differ)
}

// toolsPage lists, for members of tool_pins' admin_groups, the tools whose
// definition changed since it was pinned, each with its new definition to
// read and accept, and every pinned tool.
func (h *Handler) toolsPage(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	h.showTools(w, r, s, nil, http.StatusOK)
}

func (h *Handler) showTools(w http.ResponseWriter, r *http.Request, s *websession.Session, n *notice, status int) {
	recs, err := h.pins.List(r.Context(), s.Caller())
	switch {
	case errors.Is(err, toolpin.ErrNotAdmin):
		h.refuse(w, r, http.StatusForbidden, "Not allowed", "Only the administrators of tool pins see this page.")
		return
	case err != nil:
		h.logger.Error("listing tool pins", zap.Error(err))
		h.refuse(w, r, http.StatusServiceUnavailable, "Unavailable", "toolgate cannot read the tool pins right now (its storage is unavailable). Try again in a moment.")
		return
	}
	var changes []toolChange
	var pinned []*toolpin.Record
	df := newDiffer()
	for _, rec := range recs {
		c := toolChange{Record: rec, Pinned: rec.Digest}
		if svc := h.app.Registry().Lookup(rec.Service); svc != nil && svc.Pin(rec.Tool) != "" {
			c.Pinned, c.Registry = svc.Pin(rec.Tool), true
		}
		if rec.Changed != nil {
			c.Definition = indent(rec.Changed.Definition)
			if rec.Definition != nil {
				c.Before = indent(rec.Definition)
				var compared bool
				c.Diff, compared = df.lineDiff(indent(keysInOrder(rec.Definition)), indent(keysInOrder(rec.Changed.Definition)))
				c.Uncompared = !compared
			}
			changes = append(changes, c)
		}
		if c.Pinned != "" && !c.Registry {
			pinned = append(pinned, rec)
		}
	}
	v := h.page(s, "Tool changes", "tools", map[string]any{"Changes": changes, "Pinned": pinned})
	v.Notice = n
	h.render(w, status, "tools", v)
}

// keysInOrder is a definition with every object's keys sorted, strings
// written as the characters they stand for and numbers as written. The pin
// digests a definition so, whatever order the upstream lists members in;
// what changed is compared so too, or a changed sentence would be lost
// among members that only moved (both definitions are still shown as the
// upstream wrote them). Text that is not JSON is returned as it is.
func keysInOrder(raw json.RawMessage) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return raw
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if enc.Encode(v) != nil {
		return raw
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n"))
}

// acceptTool accepts the changed definition the form names by its digest.
func (h *Handler) acceptTool(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	service, tool := r.PostFormValue("service"), r.PostFormValue("tool")
	_, err := h.pins.Accept(r.Context(), s.Caller(), h.app.Registry().Lookup(service), tool, r.PostFormValue("digest"))
	switch {
	case err == nil:
		h.showTools(w, r, s, ok("Accepted the new definition of "+tool+" ("+service+"): runners see and call it again."), http.StatusOK)
	case errors.Is(err, toolpin.ErrNotAdmin):
		h.refuse(w, r, http.StatusForbidden, "Not allowed", err.Error())
	case errors.Is(err, gateway.ErrStorageUnavailable):
		h.showTools(w, r, s, problem("Nothing was accepted: toolgate's storage is unavailable.", "Try again in a moment."), http.StatusServiceUnavailable)
	default:
		h.showTools(w, r, s, problem("Nothing was accepted.", err.Error()), http.StatusConflict)
	}
}
