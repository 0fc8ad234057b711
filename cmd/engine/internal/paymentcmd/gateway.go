package paymentcmd

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
	"github.com/pgdurable/pgdurable/examples/payment/fakegateway"
	"github.com/pgdurable/pgdurable/internal/localpg"
)

func gatewayCmd(env *commands.Env) *cobra.Command {
	var listen string
	var f fakegateway.Faults
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Serve the payment example's fake Stripe-compatible gateway on loopback",
		Long: `Serves examples/payment/fakegateway: payment intents, refunds and receipts with Stripe's
idempotency rules and the faults you ask for. Point the engine at it with
PAYMENT_GATEWAY_URL=http://<listen> STRIPE_API_KEY=sk_test_anything. GET /_ledger returns what it
charged and refunded, net per order and the double-charge count (JSON).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !localpg.Loopback(listen) {
				return commands.UsageError(fmt.Errorf("--listen %s: the fake gateway serves loopback only", listen))
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			gw := fakegateway.New(f)
			mux := http.NewServeMux()
			mux.HandleFunc("GET /_ledger", func(w http.ResponseWriter, r *http.Request) {
				l := gw.Ledger()
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(map[string]any{"charges": l.Charges, "refunds": l.Refunds, "requests": l.Requests,
					"net_by_order": l.NetByOrder(), "double_charges": l.DoubleCharges()})
			})
			mux.Handle("/", gw)
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			go func() { _ = srv.Serve(ln) }()
			fmt.Fprintf(env.Stdout(), "fake gateway on http://%s (faults: %.0f%% 5xx, %.0f%% 429, %.0f%% dropped after processing, latency %s); Ctrl-C stops it\n",
				ln.Addr(), f.ServerError*100, f.RateLimit*100, f.DropAfter*100, f.Latency)
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:12111", "address (loopback)")
	cmd.Flags().Float64Var(&f.ServerError, "fault-5xx", 0, "share of requests answered 503 before processing")
	cmd.Flags().Float64Var(&f.RateLimit, "fault-429", 0, "share of requests answered 429 before processing")
	cmd.Flags().Float64Var(&f.DropAfter, "fault-drop", 0, "share of requests processed, then cut off mid-response")
	cmd.Flags().DurationVar(&f.Latency, "latency", 0, "added to every request")
	return cmd
}
