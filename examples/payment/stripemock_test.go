package payment_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/examples/payment"
)

// stripeMock starts Stripe's validating mock server (stripe-mock v0.203.0)
// on loopback. It is skipped when the binary is missing, except under
// CI=true, where .ci/run installs it.
func stripeMock(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("stripe-mock")
	if err != nil {
		gopath := os.Getenv("GOPATH")
		if gopath == "" {
			gopath = filepath.Join(os.Getenv("HOME"), "go")
		}
		bin = filepath.Join(gopath, "bin", "stripe-mock")
		if _, err := os.Stat(bin); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal("stripe-mock is not installed; .ci/run installs it with go install github.com/stripe/stripe-mock@v0.203.0")
			}
			t.Skip("stripe-mock not installed (go install github.com/stripe/stripe-mock@v0.203.0)")
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "-http-addr", addr)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
			break
		}
		require.True(t, time.Now().Before(deadline), "stripe-mock did not listen on %s", addr)
		time.Sleep(50 * time.Millisecond)
	}
	return "http://" + addr
}

// Stripe's own request validation (stripe-mock checks every parameter
// against the OpenAPI spec) accepts the client's payment intent and refund.
func TestGatewayAgainstStripeMock(t *testing.T) {
	t.Parallel()
	base := stripeMock(t)
	gw, err := payment.NewGateway(payment.GatewayConfig{BaseURL: base, APIKey: "sk_test_123"}, func(string) string { return "" })
	require.NoError(t, err)
	o := payment.Order{OrderID: "ord_mock", CustomerID: "cus_1", Amount: 4999, Currency: "usd", PaymentMethod: "pm_card_visa",
		Items: []payment.Item{{SKU: "sku_tee", Qty: 2}}}

	// Execute the gateway calls the way the engine does: inside an activity
	// attempt, whose request ID is the Idempotency-Key.
	// stripe-mock keeps no state: it answers with fixtures, so the intent's
	// status is whatever its fixture says; what matters is that the
	// request passed Stripe's validation.
	var piID string
	runActivity(t, func(ctx context.Context, call activities.Call) error {
		pi, err := gw.CreatePaymentIntent(ctx, call, o)
		if err == nil {
			piID = pi.ID
		}
		return err
	})
	require.NotEmpty(t, piID)
	runActivity(t, func(ctx context.Context, call activities.Call) error {
		return gw.Refund(ctx, call, payment.Charge{PaymentIntent: piID, Amount: o.Amount, Currency: o.Currency})
	})

}

// runActivity calls fn with a Call carrying a fresh request ID, as an
// activity attempt would.
func runActivity(t *testing.T, fn func(ctx context.Context, call activities.Call) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, runActivityErr(ctx, fn))
}

func runActivityErr(ctx context.Context, fn func(ctx context.Context, call activities.Call) error) error {
	return fn(ctx, activities.Call{RequestID: uuid.Must(uuid.NewV7()), Attempt: 1})
}
