package activities

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgdurable/pgdurable/engine"
)

// IdempotencyKeyHeader is the header Stripe (and most payment APIs) read
// the idempotency key from.
const IdempotencyKeyHeader = "Idempotency-Key"

// Transport is an http.RoundTripper that sets the Idempotency-Key header of
// each request made inside an activity attempt to the attempt's request ID
// (taken from the request's context), unless the request sets it itself,
// and sends the trace context of the request's context (the attempt's
// span, see engine.Config.TracerProvider) downstream as W3C traceparent
// and tracestate headers, unless the request has a traceparent already.
type Transport struct {
	// Base makes the requests; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Header overrides IdempotencyKeyHeader.
	Header string
	// Propagator writes the trace context; nil means W3C Trace Context
	// (propagation.TraceContext{}).
	Propagator propagation.TextMapPropagator
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	header := t.Header
	if header == "" {
		header = IdempotencyKeyHeader
	}
	cloned := false
	if call, ok := CallFromContext(req.Context()); ok && req.Header.Get(header) == "" {
		req, cloned = req.Clone(req.Context()), true
		req.Header.Set(header, call.IdempotencyKey())
	}
	if trace.SpanContextFromContext(req.Context()).IsValid() && req.Header.Get("traceparent") == "" {
		if !cloned {
			req = req.Clone(req.Context())
		}
		prop := t.Propagator
		if prop == nil {
			prop = propagation.TraceContext{}
		}
		prop.Inject(req.Context(), propagation.HeaderCarrier(req.Header))
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(req)
}

// NewHTTPClient returns a client whose requests carry the activity's
// idempotency key. Build requests with http.NewRequestWithContext and the
// attempt's ctx. timeout bounds each request (0: none; prefer the
// activity's StartToCloseTimeout).
func NewHTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{Transport: &Transport{}, Timeout: timeout}
}

// HTTPError is a response with a status of 400 or more. It is registered
// with the engine (engine.RegisterError, as "activities.HTTPError"), so a
// workflow's errors.As(err, &httpErr) and httpErr.StatusCode answer the
// same after a replay.
type HTTPError struct {
	StatusCode int
	Status     string
	// Body holds the start of the response body (at most 1 KiB), for the
	// recorded error.
	Body string
	// RetryAfter is the response's Retry-After, 0 when absent.
	RetryAfter time.Duration
}

// Error renders the status and the start of the body.
func (e *HTTPError) Error() string {
	msg := "HTTP " + e.Status
	if e.Body != "" {
		msg += ": " + e.Body
	}
	return msg
}

var _ = func() error {
	if err := engine.RegisterError[*HTTPError]("activities.HTTPError"); err != nil {
		panic(err) // a name clash within this module: a programming error
	}
	return nil
}()

// ErrorClass names the status for records and metrics: "http_503".
func (e *HTTPError) ErrorClass() string { return "http_" + strconv.Itoa(e.StatusCode) }

// NoEffect reports whether the answer says the request had no effect: a
// 4xx refuses a request before acting on it, except 409, which Stripe and
// others answer while the same idempotency key is still being processed.
// A 5xx may come after the effect. See engine.NoEffect.
func (e *HTTPError) NoEffect() bool {
	return e.StatusCode >= 400 && e.StatusCode < 500 && e.StatusCode != http.StatusConflict
}

// maxErrorBody bounds the body kept in an HTTPError.
const maxErrorBody = 1 << 10

// Classify maps one HTTP round trip onto the engine's retry rules:
//
//   - nil error and status below 400: nil (the caller reads and closes the body);
//   - transport errors — timeouts (class "timeout"), connection resets and
//     unexpected EOF ("connection_reset"), refused connections
//     ("connection_refused") and unknown hosts ("dns"), both marked
//     engine.NoEffect, anything else on the wire ("network") — transient;
//   - 408, 409 (Stripe: the same key is still in flight), 429 and 5xx:
//     transient, waiting at least Retry-After when the response has one;
//   - any other 4xx: engine.Permanent — the request itself is wrong, and
//     repeating it cannot help.
//
// For a status of 400 or more it reads up to 1 KiB of the body into the
// error and closes the body. The class shows in the recorded error_class.
func Classify(resp *http.Response, err error) error {
	if err != nil {
		return classifyTransport(err)
	}
	if resp.StatusCode < 400 {
		return nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	he := &HTTPError{
		StatusCode: resp.StatusCode,
		Status:     resp.Status,
		Body:       strings.TrimSpace(string(body)),
		RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()),
	}
	switch code := resp.StatusCode; {
	case code == http.StatusRequestTimeout, code == http.StatusConflict, code == http.StatusTooManyRequests, code >= 500:
		if he.RetryAfter > 0 {
			return engine.RetryAfter(he, he.RetryAfter)
		}
		return he
	default:
		return engine.Permanent(he)
	}
}

// classifyTransport classes a failed round trip. A refused connection or
// an unknown host never reached the service, so it is marked
// engine.NoEffect; a timeout or a cut connection may come after the effect.
func classifyTransport(err error) error {
	var netErr net.Error
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return engine.WithClass(err, "timeout")
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		errors.Is(err, syscall.EPIPE):
		return engine.WithClass(err, "connection_reset")
	case errors.Is(err, syscall.ECONNREFUSED):
		return engine.NoEffect(engine.WithClass(err, "connection_refused"))
	case errors.As(err, &dnsErr) && !dnsErr.IsTimeout:
		return engine.NoEffect(engine.WithClass(err, "dns"))
	}
	return engine.WithClass(fmt.Errorf("http: %w", err), "network")
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date
// (RFC 9110 §10.2.3). Unparseable or past values give 0.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
		return max(time.Duration(secs)*time.Second, 0)
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}
