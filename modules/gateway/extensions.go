package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// Capabilities outside the kernel (approvals, for instance) may take their
// configuration from a sub-block of the toolgate global option, and keep
// state for the life of one config. The kernel knows neither: a package
// registers its sub-block's parser in init, finds its JSON in
// App.Extensions, and keeps its state with App.Shared.

var (
	optionsMu sync.Mutex
	options   = map[string]func(d *caddyfile.Dispenser) (any, error){}
)

// RegisterOption makes name a sub-block of the toolgate global option: parse
// reads it (the dispenser on the option's name) and returns the value that
// App.Extensions[name] holds as JSON. Call it from an init function.
func RegisterOption(name string, parse func(d *caddyfile.Dispenser) (any, error)) {
	optionsMu.Lock()
	defer optionsMu.Unlock()
	if _, dup := options[name]; dup {
		panic("toolgate option " + name + " registered twice")
	}
	options[name] = parse
}

func registeredOption(name string) func(d *caddyfile.Dispenser) (any, error) {
	optionsMu.Lock()
	defer optionsMu.Unlock()
	return options[name]
}

// Extension is the configuration of the registered option name, or nil.
func (a *App) Extension(name string) json.RawMessage { return a.Extensions[name] }

// Shared returns the value kept under key for this config, making it with
// create the first time. Handlers call it during Provision; a value that
// holds background work ends it when Done is closed.
func (a *App) Shared(key string, create func() (any, error)) (any, error) {
	if a.sharedMu == nil { // an App made outside Provision (tests)
		a.sharedMu = new(sync.Mutex)
	}
	a.sharedMu.Lock()
	defer a.sharedMu.Unlock()
	if v, ok := a.shared[key]; ok {
		return v, nil
	}
	v, err := create()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	if a.shared == nil {
		a.shared = map[string]any{}
	}
	a.shared[key] = v
	return v, nil
}

// ClientAnswerFunc takes a runner's answer to a request toolgate itself
// sent (an elicitation on a held call's stream). An error is the reason the
// answer is refused; its text is shown to the runner.
type ClientAnswerFunc func(ctx context.Context, call *Call, answer mcpmsg.Message) error

// TakeClientAnswers routes the runner's answers to requests whose id is a
// JSON string starting with prefix to fn, instead of the upstream: such an
// answer is toolgate's own, and is never relayed. Call it during Provision.
func (a *App) TakeClientAnswers(prefix string, fn ClientAnswerFunc) {
	if a.sharedMu == nil {
		a.sharedMu = new(sync.Mutex)
	}
	a.sharedMu.Lock()
	defer a.sharedMu.Unlock()
	if a.answers == nil {
		a.answers = map[string]ClientAnswerFunc{}
	}
	a.answers[prefix] = fn
}

// ClientAnswer hands answer to the capability whose request it answers.
// taken is false when the answer is not to a request of toolgate's own.
func (a *App) ClientAnswer(ctx context.Context, call *Call, answer mcpmsg.Message) (taken bool, err error) {
	if answer.Kind != mcpmsg.Response {
		return false, nil
	}
	fn := a.answerFor(answer.ID)
	if fn == nil {
		return false, nil
	}
	return true, fn(ctx, call, answer)
}

// OwnRequestID reports whether id (JSON text) is shaped like the id of a
// request toolgate itself sends runners: an upstream's request with such
// an id is refused, so that the runner's answer to it can never be taken
// for an answer to toolgate (an upstream asking "continue?" under the id
// of a pending in-band approval would approve another call).
func (a *App) OwnRequestID(id []byte) bool { return a.answerFor(id) != nil }

// answerFor is the function taking answers to the request id names, nil
// when none of toolgate's own requests has such an id.
func (a *App) answerFor(id []byte) ClientAnswerFunc {
	var s string
	if a.sharedMu == nil || json.Unmarshal(id, &s) != nil {
		return nil
	}
	a.sharedMu.Lock()
	defer a.sharedMu.Unlock()
	for prefix, f := range a.answers {
		if strings.HasPrefix(s, prefix) {
			return f
		}
	}
	return nil
}
