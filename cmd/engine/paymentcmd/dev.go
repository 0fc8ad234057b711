package paymentcmd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/examples/payment"
	"github.com/pgdurable/pgdurable/examples/payment/fakegateway"
)

// ApprovalRequest is the input of the approval example: an expense that
// waits for a person's decision.
type ApprovalRequest struct {
	Expense string `json:"expense"`
	Amount  int64  `json:"amount"` // in cents
}

// Decision is the payload of the approval example's "decision" signal.
type Decision struct {
	Approved bool   `json:"approved"`
	By       string `json:"by"`
}

// Approval is the signal-waiting example engine dev registers: it records
// the request, waits up to a day for the "decision" signal, and returns
// what was decided ("expired" when nobody answered).
var Approval = engine.Define("approval", func(ctx *engine.Context, in ApprovalRequest) (string, error) {
	if in.Amount <= 0 || strings.TrimSpace(in.Expense) == "" {
		return "", engine.Permanent(errors.New("approval: expense and a positive amount are required"))
	}
	if _, err := engine.Step(ctx, "notify_approver", func(context.Context) (string, error) {
		return fmt.Sprintf("asked for approval of %q (%d cents)", in.Expense, in.Amount), nil
	}, nil); err != nil {
		return "", err
	}
	d, err := engine.AwaitSignal[Decision](ctx, "decision", 24*time.Hour)
	switch {
	case errors.Is(err, engine.ErrTimeout):
		return "expired", nil
	case err != nil:
		return "", err
	case d.Approved:
		return "approved by " + d.By, nil
	}
	return "rejected by " + d.By, nil
}, nil)

// DevHelp says what Dev adds, for engine dev --help
// (commands.Options.DevHelp).
const DevHelp = `It adds the payment example on an embedded fake Stripe
gateway (unless STRIPE_API_KEY is set: then the real gateway it names), a signal-waiting
example (workflow "approval"), a few example runs, and the commands that start more.`

// Dev is engine dev's kit (commands.Options.Dev): the payment example on an
// embedded fake gateway when STRIPE_API_KEY is unset (the binary registers
// it against that gateway otherwise), the approval example, and a few
// example runs with fixed workflow IDs, so a restart adds none.
func Dev(ctx context.Context, env *commands.Env) (*commands.DevKit, error) {
	kit := &commands.DevKit{Workflows: []engine.Registration{Approval}}
	if env.Getenv("STRIPE_API_KEY") == "" {
		gwURL, stop, err := serveLoopback(fakegateway.New(fakegateway.Faults{}))
		if err != nil {
			return nil, err
		}
		client, err := payment.NewGateway(payment.GatewayConfig{BaseURL: gwURL, APIKey: "sk_test_dev", Timeout: 10 * time.Second}, env.Getenv)
		if err != nil {
			stop()
			return nil, err
		}
		fmt.Fprintf(env.Stderr(), "engine dev: payment example on the fake gateway at %s (set STRIPE_API_KEY for another)\n", gwURL)
		kit.Workflows = append(kit.Workflows, payment.New(client, nil))
		kit.Stop = stop
	}
	kit.Seed = func(ctx context.Context, e *engine.Engine) error {
		for _, s := range []struct{ workflow, id, input string }{
			{payment.WorkflowName, "dev-order-1", devOrder("dev-order-1", "pm_card_visa")},
			{payment.WorkflowName, "dev-order-2", devOrder("dev-order-2", "pm_card_chargeDeclined")},
			{"approval", "expense-1", `{"expense": "team lunch", "amount": 12000}`},
		} {
			if _, err := e.StartJSON(ctx, s.workflow, []byte(s.input), &engine.StartOpts{WorkflowID: s.id}); err != nil && !errors.Is(err, engine.ErrWorkflowIDConflict) {
				return err
			}
		}
		return nil
	}
	kit.Hints = func(base string) []string {
		return []string{
			"",
			"start a payment (pm_card_chargeDeclined instead of pm_card_visa: a decline that compensates):",
			fmt.Sprintf(`  curl -s %s/v1/workflows/payment/runs -H 'Content-Type: application/json' -d '{"id": "order-42", "input": %s}'`,
				base, devOrder("order-42", "pm_card_visa")),
			"answer the approval that waits for a signal (expense-1):",
			fmt.Sprintf(`  curl -s %s/v1/runs/expense-1/signals/decision -H 'Content-Type: application/json' -d '{"approved": true, "by": "you"}'`, base),
			"start another:",
			fmt.Sprintf(`  curl -s %s/v1/workflows/approval/runs -H 'Content-Type: application/json' -d '{"id": "expense-2", "input": {"expense": "taxi", "amount": 3500}}'`, base),
			"a schedule (then pause or trigger it on the UI's Schedules page):",
			fmt.Sprintf(`  curl -s %s/v1/schedules -H 'Content-Type: application/json' -d '{"name": "hourly-expense", "cron": "@hourly", "workflow": "approval", "input": {"expense": "coffee", "amount": 450}}'`, base),
			"",
		}
	}
	return kit, nil
}

func devOrder(id, method string) string {
	return fmt.Sprintf(`{"order_id": %q, "customer_id": "cus_dev", "amount": 4999, "currency": "usd", "payment_method": %q, "items": [{"sku": "sku_tee", "qty": 1}]}`, id, method)
}
