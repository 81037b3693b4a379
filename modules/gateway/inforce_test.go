package gateway

import (
	"sync"
	"testing"
	"time"
)

// What WhileInForce runs, it runs in force: a reload stopping the App
// waits for it, and once stopped the App runs nothing more in force.
func TestWhileInForceKeepsAReloadWaiting(t *testing.T) {
	fixattack2Reloads(t)
	old := fixattack2App()
	old.stopping = new(sync.RWMutex)
	old.startedNow()

	entered, release := make(chan struct{}), make(chan struct{})
	ran := make(chan bool)
	go func() {
		ran <- old.WhileInForce(func() {
			close(entered)
			<-release
		})
	}()
	<-entered
	next := fixattack2App()
	next.startedNow()
	stopped := make(chan struct{})
	go func() {
		old.stoppedNow()
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Fatal("the reload stopped the App while WhileInForce ran in it")
	case <-time.After(100 * time.Millisecond):
	}
	if old.InForce() != old {
		t.Error("another App is in force while WhileInForce runs in this one")
	}
	close(release)
	if !<-ran {
		t.Error("WhileInForce reported that it did not run f")
	}
	<-stopped
	if old.InForce() != next {
		t.Fatal("control: the reload did not put the next App in force")
	}
	if old.WhileInForce(func() { t.Error("f ran in a stopped App") }) {
		t.Error("WhileInForce reported running in a stopped App")
	}
}
