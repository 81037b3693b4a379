package api

import (
	"errors"
	"net/http"
	"strconv"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/toolpin"
	"github.com/toolgate/toolgate/modules/gateway"
)

// pinView is a tool pin as the API shows it to an administrator.
type pinView struct {
	*toolpin.Record
	// RegistryPin is the digest the registry pins the tool to, if it does.
	RegistryPin string `json:"registry_pin,omitempty"`
}

// listPins: GET /v1/tool-pins — every pinned tool, and the changed
// definitions waiting for an administrator (?changed=true: only those).
func (h *Handler) listPins(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	var onlyChanged bool
	switch changed := r.URL.Query().Get("changed"); changed {
	case "", "false":
	case "true":
		onlyChanged = true
	default:
		// Read as "false", a monitor asking ?changed=1 would take every
		// pinned tool for a changed one.
		gateway.WriteAPIError(w, http.StatusBadRequest, "invalid_changed", "changed is true or false, not "+strconv.Quote(changed))
		return
	}
	recs, err := h.pins.List(r.Context(), caller)
	if err != nil {
		h.pinFailure(w, err)
		return
	}
	views := []pinView{}
	for _, rec := range recs {
		if onlyChanged && rec.Changed == nil {
			continue
		}
		v := pinView{Record: rec}
		if svc := h.app.Registry().Lookup(rec.Service); svc != nil {
			v.RegistryPin = svc.Pin(rec.Tool)
		}
		views = append(views, v)
	}
	gateway.WriteJSON(w, http.StatusOK, map[string]any{"pins": views})
}

// acceptPin: POST /v1/tool-pins/accept {"service", "tool", "digest"} —
// the changed definition with digest becomes the pinned one.
func (h *Handler) acceptPin(w http.ResponseWriter, r *http.Request, caller *gateway.Caller) {
	var body struct {
		Service string `json:"service"`
		Tool    string `json:"tool"`
		Digest  string `json:"digest"`
	}
	if !readJSON(w, r, &body) {
		return
	}
	if body.Service == "" || body.Tool == "" || body.Digest == "" {
		gateway.WriteAPIError(w, http.StatusBadRequest, "invalid_body",
			"service, tool and digest are required (the digest of the changed definition, as GET /v1/tool-pins?changed=true shows it)")
		return
	}
	rec, err := h.pins.Accept(r.Context(), caller, h.app.Registry().Lookup(body.Service), body.Tool, body.Digest)
	if err != nil {
		h.pinFailure(w, err)
		return
	}
	gateway.WriteJSON(w, http.StatusOK, pinView{Record: rec})
}

func (h *Handler) pinFailure(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, toolpin.ErrNotAdmin):
		gateway.WriteAPIError(w, http.StatusForbidden, "forbidden", err.Error())
	case errors.Is(err, toolpin.ErrUnknownTool):
		gateway.WriteAPIError(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, toolpin.ErrNoChange), errors.Is(err, toolpin.ErrOtherDigest),
		errors.Is(err, toolpin.ErrRegistryPin), errors.Is(err, toolpin.ErrPinningIsOff):
		gateway.WriteAPIError(w, http.StatusConflict, "conflict", err.Error())
	case errors.Is(err, gateway.ErrStorageUnavailable):
		gateway.WriteAPIError(w, http.StatusServiceUnavailable, "unavailable", "storage is unavailable; try again in a moment")
	default:
		h.logger.Error("tool pins", zap.Error(err))
		gateway.WriteAPIError(w, http.StatusInternalServerError, "internal", "internal error")
	}
}
