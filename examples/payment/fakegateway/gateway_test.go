package fakegateway

import (
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// statuses sends n receipts with key k and returns their status codes,
// with other keys' requests between each when noise is set.
func statuses(t *testing.T, g *Gateway, k string, n int, noise bool) []int {
	t.Helper()
	var got []int
	send := func(key string) int {
		form := url.Values{"order_id": {"o"}, "payment_intent": {"pi"}, "email": {"a@b.c"}}
		r := httptest.NewRequest(http.MethodPost, "/v1/receipts", strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Authorization", "Bearer sk_test")
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		g.ServeHTTP(w, r)
		return w.Code
	}
	for i := range n {
		if noise {
			for j := range 3 {
				send(k + "-other-" + string(rune('a'+i)) + string(rune('a'+j)))
			}
		}
		got = append(got, send(k))
	}
	return got
}

// A key's faults do not depend on the other requests in flight: the run
// left last used to take a shared stream's remaining draws in a row.
func TestFaultsPerKeyIgnoreOtherTraffic(t *testing.T) {
	faults := func() Faults {
		return Faults{ServerError: 0.5, RateLimit: 0.2, RandomSource: rand.New(rand.NewPCG(7, 7))}
	}
	quiet := statuses(t, New(faults()), "key-1", 12, false)
	busy := statuses(t, New(faults()), "key-1", 12, true)
	if len(quiet) != len(busy) {
		t.Fatalf("lengths differ")
	}
	failed := 0
	for i := range quiet {
		if quiet[i] != busy[i] {
			t.Fatalf("try %d: %d alone, %d among other requests (%v vs %v)", i, quiet[i], busy[i], quiet, busy)
		}
		if quiet[i] >= 429 {
			failed++
		}
	}
	if failed == 0 || failed == len(quiet) {
		t.Fatalf("faults not drawn per try: %v", quiet)
	}
}
