package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestPagesEscapeAndLeakNothing(t *testing.T) {
	w := httptest.NewRecorder()
	writePage(w, http.StatusBadRequest, page{Title: "<b>svc</b> was not connected",
		Message: providerErrorMessage("<script>alert(1)</script>"), Detail: "The provider said: <img src=x onerror=alert(1)>"})
	body := w.Body.String()
	if strings.Contains(body, "<script>") || strings.Contains(body, "<img") || strings.Contains(body, "<b>svc") {
		t.Fatalf("the page does not escape its text:\n%s", body)
	}
	h := w.Result().Header
	for k, want := range map[string]string{
		"Content-Type":    "text/html; charset=utf-8",
		"Cache-Control":   "no-store",
		"Referrer-Policy": "no-referrer",
	} {
		if h.Get(k) != want {
			t.Errorf("%s = %q, want %q", k, h.Get(k), want)
		}
	}
	if !strings.Contains(h.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Errorf("Content-Security-Policy = %q", h.Get("Content-Security-Policy"))
	}
	if got := providerErrorMessage("access_denied"); !strings.Contains(got, "declined") {
		t.Errorf("access_denied: %q", got)
	}
}
