// Package fakegateway is a Stripe-compatible payment API for demos and
// tests: payment intents (confirm=true), refunds and receipts, with
// Stripe's idempotency rules and injectable faults.
//
// Idempotency (https://docs.stripe.com/api/idempotent_requests): the first
// response for an Idempotency-Key — success or error, once processing
// began — is stored and replayed for the same key and the same parameters
// (header Idempotent-Replayed: true); the same key with other parameters
// is a 400 idempotency_error; a key whose first request is still in flight
// gets 409 idempotency_key_in_use. Requests rejected before processing
// (validation, injected 5xx and 429) are not stored.
package fakegateway

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DeclineMethod is the test payment method that is always declined (402),
// as in Stripe's test mode.
const DeclineMethod = "pm_card_chargeDeclined"

// Faults are injected per request, before processing (5xx, 429), or after
// it (drop: the charge is made, then the connection is cut mid-response).
//
// A request with an Idempotency-Key draws its fault from its key and how
// many times the key was tried, not from a stream shared by all requests:
// the tries of one key are independent whatever else is in flight. With one
// shared stream, the run left last took every remaining draw in a row, so a
// cluster of low draws near the stream's end failed all its retries in some
// interleavings and not in others.
type Faults struct {
	Latency      time.Duration // added to every request
	ServerError  float64       // share of requests answered 503 before processing
	RateLimit    float64       // share answered 429 (Retry-After: 1) before processing
	DropAfter    float64       // share processed, then cut off mid-response
	RandomSource *rand.Rand    // nil: a fixed seed, so runs repeat
}

// Gateway is the fake API. Its zero value is not usable; use New.
type Gateway struct {
	mu      sync.Mutex
	faults  Faults
	rnd     *rand.Rand
	seed    uint64            // mixed into per-key draws; taken from rnd
	tries   map[string]uint64 // requests by Idempotency-Key
	keys    map[string]*stored
	intents map[string]*intent
	refunds []Refund
	charges []Charge
	seq     int
	counts  map[string]int // requests by route
}

type stored struct {
	params   string // hash of the request's parameters
	inFlight bool
	status   int
	body     []byte
}

type intent struct {
	ID       string
	Amount   int64
	Currency string
	OrderID  string
	Refunded int64
}

// Charge is a successful payment intent the gateway applied.
type Charge struct {
	PaymentIntent string
	OrderID       string
	Amount        int64
	Key           string
}

// Refund is a refund the gateway applied.
type Refund struct {
	ID            string
	PaymentIntent string
	OrderID       string
	Amount        int64
	Key           string
}

// New returns a gateway with faults f.
func New(f Faults) *Gateway {
	rnd := f.RandomSource
	if rnd == nil {
		rnd = rand.New(rand.NewPCG(1, 2))
	}
	return &Gateway{faults: f, rnd: rnd, seed: rnd.Uint64(), tries: map[string]uint64{}, keys: map[string]*stored{}, intents: map[string]*intent{}, counts: map[string]int{}}
}

// SetFaults changes the faults for later requests.
func (g *Gateway) SetFaults(f Faults) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f.RandomSource == nil {
		f.RandomSource = g.rnd
	}
	g.faults, g.rnd, g.seed = f, f.RandomSource, f.RandomSource.Uint64()
}

// ServeHTTP implements http.Handler.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer sk_") {
		writeStripeError(w, http.StatusUnauthorized, "invalid_request_error", "", "Invalid API Key provided.")
		return
	}
	route := r.Method + " " + r.URL.Path
	var handle func(url.Values, string) (int, any, *intent)
	switch route {
	case "POST /v1/payment_intents":
		handle = g.createPaymentIntent
	case "POST /v1/refunds":
		handle = g.createRefund
	case "POST /v1/receipts":
		handle = g.sendReceipt
	default:
		writeStripeError(w, http.StatusNotFound, "invalid_request_error", "", "Unrecognized request URL ("+route+").")
		return
	}
	if err := r.ParseForm(); err != nil {
		writeStripeError(w, http.StatusBadRequest, "invalid_request_error", "", "Malformed form body: "+err.Error())
		return
	}
	key := r.Header.Get("Idempotency-Key")
	g.mu.Lock()
	g.counts[route]++
	f := g.faults
	var roll float64
	if key != "" {
		g.tries[key]++
		h := fnv.New64a()
		h.Write([]byte(key))
		roll = rand.New(rand.NewPCG(g.seed^h.Sum64(), g.tries[key])).Float64()
	} else {
		roll = g.rnd.Float64()
	}
	g.mu.Unlock()
	if f.Latency > 0 {
		time.Sleep(f.Latency)
	}
	switch {
	case roll < f.ServerError:
		writeStripeError(w, http.StatusServiceUnavailable, "api_error", "", "Injected fault: service unavailable.")
		return
	case roll < f.ServerError+f.RateLimit:
		w.Header().Set("Retry-After", "1")
		writeStripeError(w, http.StatusTooManyRequests, "rate_limit_error", "rate_limit", "Injected fault: too many requests.")
		return
	}
	drop := roll >= f.ServerError+f.RateLimit && roll < f.ServerError+f.RateLimit+f.DropAfter

	params := paramsHash(route, r.PostForm)
	if key != "" {
		g.mu.Lock()
		s, seen := g.keys[key]
		switch {
		case seen && s.params != params:
			g.mu.Unlock()
			writeStripeError(w, http.StatusBadRequest, "idempotency_error", "",
				"Keys for idempotent requests can only be used with the same parameters they were first used with.")
			return
		case seen && s.inFlight:
			g.mu.Unlock()
			writeStripeError(w, http.StatusConflict, "idempotency_error", "idempotency_key_in_use",
				"There is currently another in-progress request using this Stripe API key and idempotency key.")
			return
		case seen:
			g.mu.Unlock()
			w.Header().Set("Idempotent-Replayed", "true")
			writeRaw(w, s.status, s.body)
			return
		}
		g.keys[key] = &stored{params: params, inFlight: true}
		g.mu.Unlock()
	}
	status, resp, _ := handle(r.PostForm, key)
	body, _ := json.Marshal(resp)
	if key != "" {
		g.mu.Lock()
		if status == http.StatusBadRequest && isValidation(resp) {
			delete(g.keys, key) // rejected before processing: not stored
		} else {
			g.keys[key] = &stored{params: params, status: status, body: body}
		}
		g.mu.Unlock()
	}
	if drop {
		dropConnection(w)
		return
	}
	writeRaw(w, status, body)
}

// dropConnection writes the start of a status line and closes the
// connection: the client sees an error, not a silent retry (Go's transport
// re-sends idempotent requests that got no byte at all).
func dropConnection(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("fakegateway: response writer cannot be hijacked")
	}
	conn, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Le")
	_ = buf.Flush()
	_ = conn.Close()
}

func (g *Gateway) createPaymentIntent(p url.Values, key string) (int, any, *intent) {
	amount, err := strconv.ParseInt(p.Get("amount"), 10, 64)
	if err != nil || amount <= 0 {
		return validation("amount", "Invalid positive integer: amount.")
	}
	currency := p.Get("currency")
	if len(currency) != 3 || strings.ToLower(currency) != currency {
		return validation("currency", "Invalid currency: "+currency+".")
	}
	method := p.Get("payment_method")
	if !strings.HasPrefix(method, "pm_") {
		return validation("payment_method", "No such PaymentMethod: '"+method+"'.")
	}
	if p.Get("confirm") != "true" {
		return validation("confirm", "This fake gateway only supports confirm=true.")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seq++
	id := fmt.Sprintf("pi_%06d", g.seq)
	if method == DeclineMethod {
		return http.StatusPaymentRequired, map[string]any{"error": map[string]any{
			"type": "card_error", "code": "card_declined", "decline_code": "generic_decline",
			"message": "Your card was declined.", "payment_intent": map[string]any{"id": id, "object": "payment_intent", "status": "requires_payment_method"},
		}}, nil
	}
	in := &intent{ID: id, Amount: amount, Currency: currency, OrderID: p.Get("metadata[order_id]")}
	g.intents[id] = in
	g.charges = append(g.charges, Charge{PaymentIntent: id, OrderID: in.OrderID, Amount: amount, Key: key})
	return http.StatusOK, paymentIntentJSON(in), in
}

func (g *Gateway) createRefund(p url.Values, key string) (int, any, *intent) {
	g.mu.Lock()
	defer g.mu.Unlock()
	in, ok := g.intents[p.Get("payment_intent")]
	if !ok {
		return validation("payment_intent", "No such payment_intent: '"+p.Get("payment_intent")+"'")
	}
	amount := in.Amount - in.Refunded
	if v := p.Get("amount"); v != "" {
		var err error
		if amount, err = strconv.ParseInt(v, 10, 64); err != nil || amount <= 0 {
			return validation("amount", "Invalid positive integer: amount.")
		}
	}
	if amount > in.Amount-in.Refunded {
		return validation("amount", fmt.Sprintf("Refund amount (%d) is greater than unrefunded amount on charge (%d)", amount, in.Amount-in.Refunded))
	}
	g.seq++
	ref := Refund{ID: fmt.Sprintf("re_%06d", g.seq), PaymentIntent: in.ID, OrderID: in.OrderID, Amount: amount, Key: key}
	in.Refunded += amount
	g.refunds = append(g.refunds, ref)
	return http.StatusOK, map[string]any{"id": ref.ID, "object": "refund", "amount": amount, "currency": in.Currency,
		"payment_intent": in.ID, "status": "succeeded"}, nil
}

func (g *Gateway) sendReceipt(p url.Values, _ string) (int, any, *intent) {
	if p.Get("email") == "" && p.Get("customer") == "" {
		return validation("customer", "A receipt needs a customer or an email.")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seq++
	return http.StatusOK, map[string]any{"id": fmt.Sprintf("rcpt_%06d", g.seq), "object": "receipt", "order_id": p.Get("order_id")}, nil
}

func paymentIntentJSON(in *intent) map[string]any {
	return map[string]any{"id": in.ID, "object": "payment_intent", "amount": in.Amount, "amount_received": in.Amount,
		"currency": in.Currency, "status": "succeeded", "metadata": map[string]string{"order_id": in.OrderID}}
}

func validation(param, msg string) (int, any, *intent) {
	return http.StatusBadRequest, map[string]any{"error": map[string]any{"type": "invalid_request_error", "param": param, "message": msg}}, nil
}

func isValidation(resp any) bool {
	m, _ := resp.(map[string]any)
	e, _ := m["error"].(map[string]any)
	return e["type"] == "invalid_request_error"
}

func writeStripeError(w http.ResponseWriter, status int, typ, code, msg string) {
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"type": typ, "code": code, "message": msg}})
	writeRaw(w, status, body)
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", fmt.Sprintf("req_%d", time.Now().UnixNano()))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func paramsHash(route string, p url.Values) string {
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	h.Write([]byte(route))
	for _, k := range keys {
		fmt.Fprintf(h, "\x00%s=%s", k, strings.Join(p[k], "\x01"))
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// Ledger is what the gateway applied, for checks and the demo's summary.
type Ledger struct {
	Charges  []Charge
	Refunds  []Refund
	Requests map[string]int // by "METHOD /path"
}

// Ledger returns a copy of everything the gateway applied.
func (g *Gateway) Ledger() Ledger {
	g.mu.Lock()
	defer g.mu.Unlock()
	req := map[string]int{}
	for k, v := range g.counts {
		req[k] = v
	}
	return Ledger{Charges: append([]Charge(nil), g.charges...), Refunds: append([]Refund(nil), g.refunds...), Requests: req}
}

// NetByOrder is each order's charged minus refunded amount.
func (l Ledger) NetByOrder() map[string]int64 {
	net := map[string]int64{}
	for _, c := range l.Charges {
		net[c.OrderID] += c.Amount
	}
	for _, r := range l.Refunds {
		net[r.OrderID] -= r.Amount
	}
	return net
}

// DoubleCharges counts orders charged successfully more than once.
func (l Ledger) DoubleCharges() int {
	n := map[string]int{}
	for _, c := range l.Charges {
		n[c.OrderID]++
	}
	d := 0
	for _, k := range n {
		if k > 1 {
			d++
		}
	}
	return d
}
