package gateway

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// The audit trail (the logger toolgate.audit) holds an entry for every
// policy decision (package policy), approval event (package approval) and
// tool pin event (package toolpin) — and, written here, one for every
// call a step of the pipeline refuses outside the policy: before it runs
// (a tool off the allowlist, a changed tool's pin, another user's
// session), or after it allowed the call (no credential to send, a limit
// of streams). A refusal after the policy names the policy's decision
// (decision_id), so that the trail never shows an allowed call as one
// that ran when it did not.

// AuditSessionRef names a toolgate session in the audit trail without
// revealing its id: the first 16 hex digits of the id's SHA-256.
func AuditSessionRef(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:8])
}

// AuditRefused writes to the audit trail that step refused call, and why
// (toolgate's words, never the runner's message): the entry "refused",
// naming the step's handler (toolgate_registry, …), with the decision it
// follows when the policy had decided the call.
func AuditRefused(call *Call, step Step, why string) {
	audit := caddy.Log().Named("toolgate.audit")
	ce := audit.Check(zap.InfoLevel, "refused")
	if ce == nil || call == nil {
		return
	}
	fields := make([]zap.Field, 0, 9)
	if call.Decision != nil {
		fields = append(fields, zap.String("decision_id", call.Decision.ID))
	}
	user, session, service := "", "", ""
	if call.Caller != nil {
		user = call.Caller.User
	}
	if call.Session != nil {
		session = AuditSessionRef(call.Session.ID)
	}
	if call.Service != nil {
		service = call.Service.ID
	}
	fields = append(fields, zap.Stringer("step", step), zap.String("user", user), zap.String("session", session),
		zap.String("service", service), zap.String("method", call.Method), zap.String("tool", call.Message.Name),
		zap.String("reason", why))
	ce.Write(fields...)
}
