package payment

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v82"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/engine"
)

// Gateway talks to Stripe (or stripe-mock, or the fake gateway) through the
// official SDK, with the SDK's own retries off: the engine retries, with
// the stored request ID as the idempotency key on every attempt.
type Gateway struct {
	sc      *stripe.Client
	baseURL string
	key     string
	http    *http.Client
}

// GatewayConfig configures a Gateway. Empty fields read PAYMENT_GATEWAY_URL
// (default https://api.stripe.com) and STRIPE_API_KEY.
type GatewayConfig struct {
	BaseURL string
	APIKey  string
	Timeout time.Duration // per request; default 30s
}

// NewGateway builds a Gateway. It returns an error when no API key is set.
func NewGateway(cfg GatewayConfig, getenv func(string) string) (*Gateway, error) {
	if cfg.BaseURL == "" {
		cfg.BaseURL = getenv("PAYMENT_GATEWAY_URL")
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = "https://api.stripe.com"
	}
	if cfg.APIKey == "" {
		cfg.APIKey = getenv("STRIPE_API_KEY")
	}
	if cfg.APIKey == "" {
		return nil, errors.New("payment: set STRIPE_API_KEY (a test-mode key, sk_test_...)")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	hc := &http.Client{Timeout: cfg.Timeout}
	noRetries := int64(0)
	backends := stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String(strings.TrimRight(cfg.BaseURL, "/")),
		HTTPClient:        hc,
		MaxNetworkRetries: &noRetries,
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return &Gateway{
		sc:      stripe.NewClient(cfg.APIKey, stripe.WithBackends(backends)),
		baseURL: strings.TrimRight(cfg.BaseURL, "/"),
		key:     cfg.APIKey,
		http:    hc,
	}, nil
}

// Charge is a confirmed payment intent.
type Charge struct {
	PaymentIntent string `json:"payment_intent"`
	Amount        int64  `json:"amount"`
	Currency      string `json:"currency"`
}

// Charge creates and confirms a payment intent for o (POST
// /v1/payment_intents, confirm=true), with call's request ID as the
// Idempotency-Key, and requires it to have succeeded.
func (g *Gateway) Charge(ctx context.Context, call activities.Call, o Order) (Charge, error) {
	pi, err := g.CreatePaymentIntent(ctx, call, o)
	if err != nil {
		return Charge{}, err
	}
	if pi.Status != stripe.PaymentIntentStatusSucceeded {
		return Charge{}, engine.WithClass(engine.Permanent(fmt.Errorf("payment intent %s is %s, not succeeded", pi.ID, pi.Status)), "payment_incomplete")
	}
	return Charge{PaymentIntent: pi.ID, Amount: pi.Amount, Currency: string(pi.Currency)}, nil
}

// CreatePaymentIntent is Charge's API call, returning Stripe's object
// whatever its status; errors are classified for the engine.
func (g *Gateway) CreatePaymentIntent(ctx context.Context, call activities.Call, o Order) (*stripe.PaymentIntent, error) {
	params := &stripe.PaymentIntentCreateParams{
		Amount:        stripe.Int64(o.Amount),
		Currency:      stripe.String(o.Currency),
		PaymentMethod: stripe.String(o.PaymentMethod),
		Confirm:       stripe.Bool(true),
		Description:   stripe.String("order " + o.OrderID),
	}
	params.AddMetadata("order_id", o.OrderID)
	params.SetIdempotencyKey(call.IdempotencyKey())
	params.Context = ctx
	pi, err := g.sc.V1PaymentIntents.Create(ctx, params)
	if err != nil {
		return nil, classify(err)
	}
	return pi, nil
}

// Refund refunds a charge in full (POST /v1/refunds) with call's request ID
// as the Idempotency-Key: the refund's own key, not the charge's.
func (g *Gateway) Refund(ctx context.Context, call activities.Call, ch Charge) error {
	params := &stripe.RefundCreateParams{PaymentIntent: stripe.String(ch.PaymentIntent)}
	params.SetIdempotencyKey(call.IdempotencyKey())
	params.Context = ctx
	_, err := g.sc.V1Refunds.Create(ctx, params)
	return classify(err)
}

// SendReceipt posts a receipt (POST /v1/receipts on the fake gateway; a
// real deployment points this at its mail service) with the activity's
// Idempotency-Key, so a retry never sends a second email.
func (g *Gateway) SendReceipt(ctx context.Context, call activities.Call, o Order, ch Charge) error {
	form := url.Values{"customer": {o.CustomerID}, "order_id": {o.OrderID}, "payment_intent": {ch.PaymentIntent}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.baseURL+"/v1/receipts", strings.NewReader(form.Encode()))
	if err != nil {
		return engine.Permanent(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+g.key)
	req.Header.Set(activities.IdempotencyKeyHeader, call.IdempotencyKey())
	resp, err := g.http.Do(req)
	if err := activities.Classify(resp, err); err != nil {
		return err
	}
	return resp.Body.Close()
}

// classify maps the SDK's errors onto the engine's retry rules: declines
// (402) and other 4xx are permanent, 409 (the key is in flight), 429 and
// 5xx transient, network errors transient (activities.Classify).
func classify(err error) error {
	if err == nil {
		return nil
	}
	var se *stripe.Error
	if !errors.As(err, &se) || se.HTTPStatusCode == 0 {
		return activities.Classify(nil, err)
	}
	msg := fmt.Errorf("stripe %d %s: %s", se.HTTPStatusCode, se.Type, se.Msg)
	switch code := se.HTTPStatusCode; {
	case code == http.StatusPaymentRequired:
		class := "card_declined"
		if se.DeclineCode != "" {
			class = "card_declined_" + string(se.DeclineCode)
		}
		return engine.WithClass(engine.Permanent(msg), engine.ErrorClass(class))
	case code == http.StatusTooManyRequests:
		// Refused before processing: the charge was not made.
		return engine.NoEffect(engine.WithClass(msg, "http_429"))
	case code == http.StatusConflict, code >= 500:
		return engine.WithClass(msg, engine.ErrorClass(fmt.Sprintf("http_%d", code)))
	default:
		return engine.WithClass(engine.Permanent(msg), engine.ErrorClass(fmt.Sprintf("http_%d", code)))
	}
}
