package gateway

import (
	"encoding/json"
	"fmt"
	"sync"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
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
