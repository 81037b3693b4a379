package approval

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Scopes of an approval: what a decision authorizes.
const (
	// ScopeOnce authorizes the next identical call exactly once.
	ScopeOnce = "once"
	// ScopeSession authorizes every identical call in the same toolgate
	// session until the approval expires.
	ScopeSession = "session"
	// ScopeTool authorizes calls of the tool with any arguments in the same
	// toolgate session until the approval expires; only where the policy
	// lists it.
	ScopeTool = "tool"
)

// Defaults and bounds of a Spec.
const (
	DefaultTTL = 10 * time.Minute
	MaxTTL     = 24 * time.Hour
)

// Spec is what a policy's ask decision says about its approval, the
// decision's "approval" object:
//
//	{"approvers": {"groups": ["secops"], "users": []}, "requester_may_approve": false,
//	 "ttl": "15m", "scopes": ["once", "session"], "in_band": false}
//
// Every field is optional: by default the requester approves their own
// call, within 10 minutes, for once or for the session.
type Spec struct {
	Approvers struct {
		Groups []string `json:"groups,omitempty"`
		Users  []string `json:"users,omitempty"`
	} `json:"approvers"`
	RequesterMayApprove bool          `json:"requester_may_approve"`
	TTL                 time.Duration `json:"ttl"`
	Scopes              []string      `json:"scopes"`
	InBand              bool          `json:"in_band,omitempty"`
}

// ParseSpec reads a decision's approval object (JSON, or nil for none). A
// malformed one is an error: the gateway then denies, never guesses.
func ParseSpec(raw []byte) (Spec, error) {
	spec := Spec{RequesterMayApprove: true, TTL: DefaultTTL, Scopes: []string{ScopeOnce, ScopeSession}}
	if len(raw) == 0 {
		return spec, nil
	}
	var in struct {
		Approvers *struct {
			Groups []string `json:"groups"`
			Users  []string `json:"users"`
		} `json:"approvers"`
		RequesterMayApprove *bool    `json:"requester_may_approve"`
		TTL                 *string  `json:"ttl"`
		Scopes              []string `json:"scopes"`
		InBand              *bool    `json:"in_band"`
	}
	dec := json.NewDecoder(bytesReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return spec, fmt.Errorf("the approval object is malformed: %v", err)
	}
	if in.Approvers != nil {
		spec.Approvers.Groups, spec.Approvers.Users = in.Approvers.Groups, in.Approvers.Users
	}
	if in.RequesterMayApprove != nil {
		spec.RequesterMayApprove = *in.RequesterMayApprove
	}
	if in.TTL != nil {
		d, err := time.ParseDuration(*in.TTL)
		if err != nil || d <= 0 || d > MaxTTL {
			return spec, fmt.Errorf("the approval ttl %q is not a duration between 0 and %s", *in.TTL, MaxTTL)
		}
		spec.TTL = d
	}
	if in.Scopes != nil {
		if len(in.Scopes) == 0 {
			return spec, errors.New("the approval lists no scopes")
		}
		for _, s := range in.Scopes {
			if s != ScopeOnce && s != ScopeSession && s != ScopeTool {
				return spec, fmt.Errorf("the approval scope %q is not once, session or tool", s)
			}
		}
		spec.Scopes = slices.Compact(slices.Clone(in.Scopes))
	}
	if in.InBand != nil {
		spec.InBand = *in.InBand
	}
	if spec.InBand && (len(spec.Approvers.Users) > 0 || len(spec.Approvers.Groups) > 0 || !spec.RequesterMayApprove) {
		return spec, errors.New("in_band approval is only for calls the requester approves alone (no approvers, requester_may_approve)")
	}
	if !spec.RequesterMayApprove && len(spec.Approvers.Users) == 0 && len(spec.Approvers.Groups) == 0 {
		return spec, errors.New("nobody may approve: the requester may not, and no approvers are named")
	}
	return spec, nil
}
