package policy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Settings for a service the registry does not have (a misspelled id)
// apply to nothing: loading them warns, naming the setting, at the
// config's start and on every reload of the policy; settings of a known
// service do not.
func TestSettingsOfAnUnknownServiceWarn(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, "package toolgate.request\n\ndecision := {\"action\": \"allow\"}\n")
	data := func(text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "data.json"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data(`{"toolgate": {"settings": {"services": {"trackr": {"read_only": true}, "tracker": {}}}}}`)
	e, logs := testEngine(t, dir, time.Hour)
	warned := func() []string {
		var named []string
		for _, l := range logs.TakeAll() {
			if strings.Contains(l.Message, "name a service the registry does not have") {
				named = append(named, l.ContextMap()["setting"].(string))
			}
		}
		return named
	}
	if got := warned(); len(got) != 0 {
		t.Fatalf("warned before the registry was known: %v", got)
	}
	reload := func() {
		t.Helper()
		// Twice: a change is loaded once two polls saw it alike.
		for range 2 {
			if err := e.reload(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		if got := e.current.Load().services; len(got) != 1 {
			t.Fatalf("premise: the policy's settings name %v after the reload", got)
		}
	}
	restore := e.setServices(func(id string) bool { return id == "tracker" })
	e.checkServices() // as the config's start does
	if got := warned(); len(got) != 1 || got[0] != "settings.services.trackr" {
		t.Errorf("at start: warned of %v, want settings.services.trackr only", got)
	}
	data(`{"toolgate": {"settings": {"services": {"tracker": {"read_only": true}}}}}`)
	reload()
	if got := warned(); len(got) != 0 {
		t.Errorf("the typo mended: still warned of %v", got)
	}
	data(`{"toolgate": {"settings": {"services": {"trackerr": {"read_only": true}}}}}`)
	reload()
	if got := warned(); len(got) != 1 || got[0] != "settings.services.trackerr" {
		t.Errorf("on reload: warned of %v, want settings.services.trackerr", got)
	}
	restore()
}
