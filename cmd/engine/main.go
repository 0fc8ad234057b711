// Command engine runs pgdurable as a service (engine serve) and operates it
// from the shell: migrations, runs, dead jobs, and the payment demo. This
// build adds the payment example's commands (demo, gateway, chaos) and
// bench row from package paymentcmd, and registers its workflow when
// STRIPE_API_KEY is set (PAYMENT_GATEWAY_URL points it at Stripe test
// mode, stripe-mock or the fake gateway). engine dev adds the example on an
// embedded fake gateway and a signal-waiting example (paymentcmd.Dev).
// See README.md and docs/operating.md.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
	"github.com/pgdurable/pgdurable/cmd/engine/internal/paymentcmd"
	"github.com/pgdurable/pgdurable/examples/payment"
)

func main() {
	opts := commands.Options{Migrate: payment.Migrate, Commands: paymentcmd.Commands(), BenchRows: []commands.BenchRow{paymentcmd.BenchRow, paymentcmd.BenchRowManySKUs},
		Dev: paymentcmd.Dev, DevHelp: paymentcmd.DevHelp}
	if os.Getenv("STRIPE_API_KEY") != "" {
		gw, err := payment.NewGateway(payment.GatewayConfig{}, os.Getenv)
		if err != nil {
			fmt.Fprintln(os.Stderr, "error:", err)
			os.Exit(1)
		}
		opts.Workflows = payment.Registrations(gw, nil)
	}
	os.Exit(commands.Execute(context.Background(), os.Args[1:], opts))
}
