package commands

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/httpapi"
)

func (g *global) queuesCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "queues", Short: "Flow-controlled queues: their limits, backlogs and pauses"}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the queues with their limits, ready and running runs, pause and serving processes",
		Long: `Lists each flow-controlled queue: one a process registers (RegisterQueue) or one that runs
name. READY counts the runs waiting in it for a slot (OLDEST: how long the oldest has waited),
RUNNING those holding a slot (a live lease), LIMITS the queue's concurrency (all keys, and per
key) and rate limits, PROCESSES the live engine processes that serve it with their workers.
A queue that no process serves says so: its runs wait until one starts.`,
		Args: cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, e backend, _ []string) error {
			qs, err := e.ListQueues(ctx)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return writeJSON(g.opts.Stdout, httpapi.QueueList{Queues: qs})
			}
			t := newTable(g.opts.Stdout, "QUEUE", "STATE", "READY", "OLDEST", "RUNNING", "LIMITS", "PROCESSES")
			for _, q := range qs {
				state := "serving"
				switch {
				case !q.Defined:
					state = "not defined"
				case q.Paused:
					state = "paused"
					if q.PauseReason != "" {
						state += " (" + q.PauseReason + ")"
					}
					if q.PausedBy != "" {
						state += " by " + q.PausedBy
					}
				case len(q.Processes) == 0:
					state = "no process serves it"
				}
				oldest := "-"
				if q.OldestReadyAt != nil {
					oldest = time.Since(*q.OldestReadyAt).Round(time.Second).String()
				}
				procs := make([]string, len(q.Processes))
				for i, p := range q.Processes {
					procs[i] = fmt.Sprintf("%s:%d (%d workers)", p.Hostname, p.PID, p.Workers)
				}
				t.row(q.Name, state, fmt.Sprint(q.Ready), oldest, fmt.Sprint(q.Running), queueLimits(q), strings.Join(procs, "; "))
			}
			t.flush()
			if len(qs) == 0 {
				fmt.Fprintln(g.opts.Stdout, "no queue: workflows name one with WorkflowOpts.Queue, and processes serve it with RegisterQueue")
			}
			return nil
		}),
	}
	var opts engine.PauseOpts
	pause := &cobra.Command{
		Use:   "pause QUEUE [--reason TEXT] [--by NAME]",
		Short: "Pause a queue: no run of it starts; running steps finish, then their runs wait in it",
		Long: `Pauses the queue for every process, within about 100 ms: no run of it is admitted, a run
that is executing finishes the step it is in and then waits in the queue, and timers and signals
keep arriving (the runs they wake wait in the queue too). resume starts the backlog again at the
queue's limits. The pause keeps --reason and --by (each up to 400 bytes), which queues list and
the run pages show, and the engine logs both.`,
		Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, e backend, args []string) error {
			if err := e.PauseQueue(ctx, args[0], &opts); err != nil {
				return err
			}
			fmt.Fprintf(g.opts.Stdout, "queue %s paused\n", args[0])
			return nil
		}),
	}
	pause.Flags().StringVar(&opts.Reason, "reason", "", "why the queue is paused, kept with the pause")
	pause.Flags().StringVar(&opts.By, "by", "", "who pauses it")
	var by string
	resume := &cobra.Command{
		Use:   "resume QUEUE [--by NAME]",
		Short: "Resume a paused queue: its backlog starts at the queue's limits",
		Args:  cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, e backend, args []string) error {
			if err := e.ResumeQueue(ctx, args[0], by); err != nil {
				return err
			}
			fmt.Fprintf(g.opts.Stdout, "queue %s resumed\n", args[0])
			return nil
		}),
	}
	resume.Flags().StringVar(&by, "by", "", "who resumes it")
	cmd.AddCommand(list, pause, resume)
	return cmd
}

// queueLimits renders a queue's limits: "5 at once, 1 per key, 50/1s".
func queueLimits(q engine.QueueInfo) string {
	var parts []string
	if q.Concurrency > 0 {
		parts = append(parts, fmt.Sprintf("%d at once", q.Concurrency))
	}
	if q.KeyConcurrency > 0 {
		parts = append(parts, fmt.Sprintf("%d per key", q.KeyConcurrency))
	}
	if r := q.RateLimit; r.Limit > 0 {
		parts = append(parts, fmt.Sprintf("%d/%s", r.Limit, r.Period))
	}
	if r := q.KeyRateLimit; r.Limit > 0 {
		parts = append(parts, fmt.Sprintf("%d/%s per key", r.Limit, r.Period))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
