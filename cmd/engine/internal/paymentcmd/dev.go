package paymentcmd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

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
example (workflow "approval"), an example that parks as a dead job (workflow "export"), a
few example runs (one of each; the export's is on the dead-job desk within a second), and
the commands that start more.`

// Dev is engine dev's kit (commands.Options.Dev): the payment example on an
// embedded fake gateway when STRIPE_API_KEY is unset (the binary registers
// it against that gateway otherwise), the approval example, the export
// example (a run of it parks as a dead job: see newExport), and a few
// example runs, numbered: the first start on a database makes
// dev-order-1, expense-1, dev-export-1..., each later one the next number,
// so every start has a parked run on the dead-job desk and an approval
// waiting for the signal its hints send.
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
		kit.Workflows = append(kit.Workflows, payment.Registrations(client, nil)...)
		kit.Stop = stop
	}
	export, watch := newExport()
	kit.Workflows = append(kit.Workflows, export)
	n := 1 // this start's number: its runs' workflow IDs end in it
	kit.Seed = func(ctx context.Context, e *engine.Engine) error {
		// The first number whose approval run is new: an earlier start on
		// this database took the ones before.
		approval := `{"expense": "team lunch", "amount": 12000}`
		for ; ; n++ {
			res, err := e.StartJSON(ctx, "approval", []byte(approval), &engine.StartOpts{WorkflowID: fmt.Sprint("expense-", n)})
			if err != nil && !errors.Is(err, engine.ErrWorkflowIDConflict) {
				return err
			}
			if err == nil && !res.Existing {
				break
			}
			if n == maxDevStarts {
				return fmt.Errorf("%d earlier engine dev starts on this database: drop it to start afresh", n)
			}
		}
		orders := []string{fmt.Sprint("dev-order-", 2*n-1), fmt.Sprint("dev-order-", 2*n)}
		for _, s := range []struct{ workflow, id, input string }{
			{payment.WorkflowName, orders[0], devOrder(orders[0], "pm_card_visa")},
			{payment.WorkflowName, orders[1], devOrder(orders[1], "pm_card_chargeDeclined")},
			{"export", fmt.Sprint("dev-export-", n), `{"report": "daily-sales", "bucket": "dev-reports"}`},
		} {
			res, err := e.StartJSON(ctx, s.workflow, []byte(s.input), &engine.StartOpts{WorkflowID: s.id})
			if err != nil && !errors.Is(err, engine.ErrWorkflowIDConflict) {
				return err
			}
			if s.workflow == "export" && res != nil {
				watch.start(e, res.RunID)
			}
		}
		return nil
	}
	stop := kit.Stop
	kit.Stop = func() {
		watch.stop()
		if stop != nil {
			stop()
		}
	}
	kit.StartExample = func() (string, string, string) {
		id := fmt.Sprint("cli-order-", n)
		return payment.WorkflowName, id, devOrder(id, "pm_card_visa")
	}
	kit.Hints = func(base string) []string {
		return []string{
			"",
			"start a payment (pm_card_chargeDeclined instead of pm_card_visa: a decline that compensates):",
			fmt.Sprintf(`  curl -s %s/v1/workflows/payment/runs -H 'Content-Type: application/json' -d '{"id": "order-%d", "input": %s}'`,
				base, n, devOrder(fmt.Sprint("order-", n), "pm_card_visa")),
			fmt.Sprintf("answer the approval that waits for a signal (expense-%d):", n),
			fmt.Sprintf(`  curl -s %s/v1/runs/expense-%d/signals/decision -H 'Content-Type: application/json' -d '{"approved": true, "by": "you"}'`, base, n),
			"start another:",
			fmt.Sprintf(`  curl -s %s/v1/workflows/approval/runs -H 'Content-Type: application/json' -d '{"id": "taxi-%d", "input": {"expense": "taxi", "amount": 3500}}'`, base, n),
			fmt.Sprintf("a dead job (dev-export-%d: its upload failed 3 times, so it is parked; the bucket is back once it is):", n),
			fmt.Sprintf("  open %s/ui/dead-jobs and replay it, or: curl -s '%s/v1/dead-jobs?open=true'", base, base),
			fmt.Sprintf(`  then, with the "id" it lists: curl -s -X POST %s/v1/dead-jobs/<id>/replay -H 'Content-Type: application/json' -d '{"by": "you"}'`, base),
			"a schedule (then pause or trigger it on the UI's Schedules page):",
			fmt.Sprintf(`  curl -s %s/v1/schedules -H 'Content-Type: application/json' -d '{"name": "hourly-expense-%d", "cron": "@hourly", "workflow": "approval", "input": {"expense": "coffee", "amount": 450}}'`, base, n),
			"",
		}
	}
	return kit, nil
}

// maxDevStarts bounds the engine dev starts one database keeps examples
// of (see Dev's numbering).
const maxDevStarts = 1000

func devOrder(id, method string) string {
	return fmt.Sprintf(`{"order_id": %q, "customer_id": "cus_dev", "amount": 4999, "currency": "usd", "payment_method": %q, "items": [{"sku": "sku_tee", "qty": 1}]}`, id, method)
}

// ExportRequest is the input of the export example: a report to upload to
// a bucket.
type ExportRequest struct {
	Report string `json:"report"`
	Bucket string `json:"bucket"`
}

// newExport is engine dev's dead-job example, workflow "export": its step
// "upload" fails (503, as from a bucket that is down) on every attempt
// until the watcher has seen the seeded run parked, and succeeds after.
// The seeded run therefore always exhausts its 3 attempts and becomes a
// dead job (retries_exhausted) within a second, and its replay from the
// dead-job desk completes. The outage is this process's: a dev restarted
// after the run was parked finds the dead job and ends the outage at once.
func newExport() (*engine.Workflow[ExportRequest, string], *outage) {
	o := &outage{}
	wf := engine.Define("export", func(ctx *engine.Context, in ExportRequest) (string, error) {
		if in.Report == "" || in.Bucket == "" {
			return "", engine.Permanent(errors.New("export: report and bucket are required"))
		}
		return engine.Step(ctx, "upload", func(context.Context) (string, error) {
			if !o.over.Load() {
				return "", fmt.Errorf("uploading %s.csv to bucket %q: 503 Service Unavailable", in.Report, in.Bucket)
			}
			return fmt.Sprintf("s3://%s/%s.csv", in.Bucket, in.Report), nil
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: 100 * time.Millisecond, MaximumAttempts: 3}})
	}, nil)
	return wf, o
}

// outage is the export example's bucket outage: over once the watcher
// has seen the seeded run's dead job.
type outage struct {
	over   atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}
}

// start watches for the dead job of run (for a minute at most), then ends
// the outage.
func (o *outage) start(e *engine.Engine, run uuid.UUID) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	o.cancel, o.done = cancel, make(chan struct{})
	go func() {
		defer close(o.done)
		defer cancel()
		for {
			jobs, _, err := e.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: run, Limit: 1})
			if err == nil && len(jobs) > 0 {
				o.over.Store(true)
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
}

// stop ends the watcher and waits for it.
func (o *outage) stop() {
	if o.cancel != nil {
		o.cancel()
		<-o.done
	}
}
