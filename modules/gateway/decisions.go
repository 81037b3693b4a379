package gateway

import "time"

// DecisionRecord is one policy decision as people may look it up later
// (the console's Activity page). It holds no arguments or results.
type DecisionRecord struct {
	Time       time.Time `json:"time"`
	User       string    `json:"user"`
	Service    string    `json:"service"`
	Method     string    `json:"method"`
	Tool       string    `json:"tool,omitempty"`
	Stage      string    `json:"stage"`
	Channel    string    `json:"channel,omitempty"` // the result stage's: result, task, error, notification, server_request
	Action     string    `json:"action"`
	Reason     string    `json:"reason,omitempty"`
	DecisionID string    `json:"decision_id"`
	Revision   string    `json:"revision,omitempty"`
}

// A DecisionRecorder keeps decisions for people to look at. RecordDecision
// is called on the request path and must not block.
type DecisionRecorder interface {
	RecordDecision(DecisionRecord)
}

// SetDecisionRecorder makes r receive every decision, unless a recorder is
// set already; it returns the recorder in use. Handlers call it in
// Provision.
func (a *App) SetDecisionRecorder(r DecisionRecorder) DecisionRecorder {
	if a.recorder == nil {
		a.recorder = r
	}
	return a.recorder
}

// RecordDecision hands d to the decision recorder, if there is one.
func (a *App) RecordDecision(d DecisionRecord) {
	if a.recorder != nil {
		a.recorder.RecordDecision(d)
	}
}
