package gateway

import (
	"strings"
	"testing"
)

// Attack (fixed): provision now replaces a service's url with CanonicalURL's
// spelling before validate runs, and validate quotes the url in its
// errors, so a refused url is reported in a spelling that appears nowhere
// in the configuration: `url HTTP://Tracker.Example.com:80/mcp` without
// allow_http is refused as "http://tracker.example.com/mcp" is plain http,
// and `url http://:80/mcp` (accepted before the change) is refused as
// "http:///mcp" has no host. An operator searching the config for the
// quoted url finds nothing. What should happen: the error quotes the url
// as it was written (placeholders expanded), as it did before the change
// (refusing a url with no host name, which Go dials on this host, is
// welcome; only its message is at issue).
// Fixed: validate reads and quotes the url as written (Service.written),
// and refuses a url with a port but no host name as having no host.
func TestCanonicalURLAdvValidateQuotesURLAsWritten(t *testing.T) {
	for _, c := range []struct {
		written   string
		allowHTTP bool
	}{
		{"HTTP://Tracker.Example.com:80/mcp", false},
		{"http://:80/mcp", true},
	} {
		s := provisioned(t, &Service{ID: "s", URL: c.written, AllowHTTP: c.allowHTTP, Tools: []string{"t"}})
		err := s.validate()
		if err != nil && !strings.Contains(err.Error(), c.written) {
			t.Errorf("url %s is refused with %q, which quotes a url the configuration does not hold", c.written, err)
		}
	}
}

// A url with a port but no host name is refused, quoted as written.
func TestServiceURLWithoutHostNameIsRefused(t *testing.T) {
	s := provisioned(t, &Service{ID: "s", URL: "http://:80/mcp", AllowHTTP: true, Tools: []string{"t"}})
	if err := s.validate(); err == nil || !strings.Contains(err.Error(), `"http://:80/mcp" has no host`) {
		t.Errorf("url http://:80/mcp: %v, want it refused as having no host", err)
	}
}
