package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
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
	options   = map[string]option{}
)

// option is a registered sub-block of the toolgate global option.
type option struct {
	parse func(d *caddyfile.Dispenser) (any, error)
	// form is the Go type the option's JSON decodes into, nil when the
	// capability checks its JSON itself (its parser returns any).
	form reflect.Type
}

// RegisterOption makes name a sub-block of the toolgate global option: parse
// reads it (the dispenser on the option's name) and returns the value that
// App.Extensions[name] holds as JSON. Call it from an init function.
//
// The type parse returns is the option's JSON form: when the config loads,
// App.Extensions[name] must decode into it strictly (no unknown fields, no
// value of the wrong type), so a JSON config cannot mistype an option the
// Caddyfile would refuse. A parser returning any leaves the check to its
// capability. An extension no capability registered is refused.
func RegisterOption[T any](name string, parse func(d *caddyfile.Dispenser) (T, error)) {
	optionsMu.Lock()
	defer optionsMu.Unlock()
	if _, dup := options[name]; dup {
		panic("toolgate option " + name + " registered twice")
	}
	o := option{parse: func(d *caddyfile.Dispenser) (any, error) { return parse(d) }}
	if form := reflect.TypeFor[T](); form.Kind() != reflect.Interface {
		o.form = form
	}
	options[name] = o
}

func registeredOption(name string) (option, bool) {
	optionsMu.Lock()
	defer optionsMu.Unlock()
	o, ok := options[name]
	return o, ok
}

// checkExtensions refuses an extension no capability registered (a typo,
// or a module this build lacks: what it was meant to turn on would be off
// without a word), and one whose JSON does not decode strictly into the
// form its capability declared.
func (a *App) checkExtensions() error {
	for _, name := range slices.Sorted(maps.Keys(a.Extensions)) {
		o, ok := registeredOption(name)
		if !ok {
			return fmt.Errorf("extensions: unknown option %q: check its spelling, or build toolgate with the module that adds it", name)
		}
		if o.form == nil {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(a.Extensions[name]))
		dec.DisallowUnknownFields()
		if err := dec.Decode(reflect.New(o.form).Interface()); err != nil {
			return fmt.Errorf("extensions: %s: %v", name, err)
		}
	}
	return nil
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
