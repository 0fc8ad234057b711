// Package paymentcmd holds the engine binary's commands that run the
// payment example (examples/payment and its fake gateway): engine demo,
// engine gateway and engine chaos, and the payment row of engine bench.
// They live apart from package commands so that a binary built on those
// commands does not link the example; cmd/engine adds them back:
//
//	commands.Options{Commands: paymentcmd.Commands(), BenchRows: []commands.BenchRow{paymentcmd.BenchRow}}
//
// They read the engine's runs, steps and dead jobs through package
// engine's API (ListRuns, GetRun, ListDeadJobs, an Observer), and only
// the example's own tables (payment_ledger, payment_reservations) with SQL.
package paymentcmd

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
)

// Commands returns the constructors of engine demo, engine gateway and
// engine chaos, for Options.Commands.
func Commands() []func(*commands.Env) *cobra.Command {
	return []func(*commands.Env) *cobra.Command{demoCmd, gatewayCmd, chaosCmd}
}

// serveLoopback serves h on a free loopback port until the returned stop.
func serveLoopback(h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
