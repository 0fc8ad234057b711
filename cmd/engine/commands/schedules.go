package commands

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/httpapi"
)

// schedulesCmd manages cron schedules: each fire starts one run with
// workflow ID schedule:<name>:<fire time in UTC>.
func (g *global) schedulesCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "schedules", Short: "Create, change, pause and inspect cron schedules"}
	cmd.AddCommand(g.scheduleSaveCmd("create"), g.scheduleSaveCmd("update"))
	cmd.AddCommand(&cobra.Command{
		Use: "list", Short: "List schedules", Args: cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, e backend, _ []string) error {
			list, err := e.ListSchedules(ctx)
			if err != nil {
				return err
			}
			if g.jsonOut {
				if list == nil {
					list = []engine.Schedule{}
				}
				return writeJSON(g.opts.Stdout, map[string]any{"schedules": list}) // GET /v1/schedules's body
			}
			t := newTable(g.opts.Stdout, "NAME", "CRON", "TIME ZONE", "WORKFLOW", "OVERLAP", "CATCH-UP", "PAUSED", "NEXT FIRE", "LAST FIRE")
			for _, s := range list {
				t.row(s.Name, s.Cron, s.TimeZone, s.Workflow, s.Overlap, s.CatchupWindow, s.Paused, s.NextFireAt, s.LastFireAt)
			}
			t.flush()
			return nil
		}),
	})
	cmd.AddCommand(&cobra.Command{
		Use: "show NAME", Short: "A schedule and its latest 20 fires", Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, e backend, args []string) error {
			s, err := e.GetSchedule(ctx, args[0])
			if err != nil {
				return err
			}
			fires, err := e.ListScheduleFires(ctx, args[0], 20)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return writeJSON(g.opts.Stdout, httpapi.ScheduleWithFires{Schedule: s, Fires: fires})
			}
			g.printSchedule(s)
			t := newTable(g.opts.Stdout, "FIRE AT", "OUTCOME", "REASON", "RUN")
			for _, f := range fires {
				var run any
				if f.RunID != nil {
					run = f.RunID.String()
				}
				t.row(f.FireAt, f.Outcome, f.Reason, run)
			}
			t.flush()
			return nil
		}),
	})
	cmd.AddCommand(&cobra.Command{
		Use: "trigger NAME", Short: "Fire a schedule now, outside its cron expression (even while paused)", Args: cobra.ExactArgs(1),
		Long: `Starts one run of the schedule's workflow with its input now, whatever its overlap policy,
with workflow ID schedule:<name>:trigger:<a new UUID v7> (every trigger starts a run of its own),
and records the fire in its history. The next cron fire is unchanged.`,
		RunE: g.withClient(func(ctx context.Context, e backend, args []string) error {
			res, err := e.TriggerSchedule(ctx, args[0])
			if err != nil {
				return err
			}
			if g.jsonOut {
				return writeJSON(g.opts.Stdout, res)
			}
			fmt.Fprintf(g.opts.Stdout, "schedule %s: triggered run %s (workflow ID %s)\n", args[0], res.RunID, text(res.WorkflowID))
			return nil
		}),
	})
	for _, act := range []struct {
		use, short string
		do         func(backend, context.Context, string) error
	}{
		{"pause", "Stop a schedule's fires", backend.PauseSchedule},
		{"resume", "Let a paused schedule fire again, from the next fire time (no catch-up)", backend.ResumeSchedule},
		{"delete", "Delete a schedule and its fire history (its runs stay)", backend.DeleteSchedule},
	} {
		cmd.AddCommand(&cobra.Command{
			Use: act.use + " NAME", Short: act.short, Args: cobra.ExactArgs(1),
			RunE: g.withClient(func(ctx context.Context, e backend, args []string) error {
				if err := act.do(e, ctx, args[0]); err != nil {
					return err
				}
				if g.jsonOut {
					if act.use == "delete" { // the API answers 204, no body
						return writeJSON(g.opts.Stdout, map[string]any{"name": args[0], "deleted": true})
					}
					s, err := e.GetSchedule(ctx, args[0]) // the API answers the schedule
					if err != nil {
						return err
					}
					return writeJSON(g.opts.Stdout, s)
				}
				fmt.Fprintf(g.opts.Stdout, "schedule %s: %sd\n", args[0], act.use)
				return nil
			}),
		})
	}
	return cmd
}

// scheduleSaveCmd is `schedules create` or `schedules update`.
func (g *global) scheduleSaveCmd(verb string) *cobra.Command {
	var spec engine.ScheduleSpec
	var input string
	cmd := &cobra.Command{
		Use:   verb + " NAME --cron SPEC --workflow NAME",
		Short: map[string]string{"create": "Create a schedule", "update": "Replace a schedule's definition"}[verb],
		Long: `--cron takes 5 fields (minute hour day-of-month month day-of-week) or a descriptor (@daily,
@hourly, @every 5m); --time-zone an IANA name (default UTC). Each fire starts one run of
--workflow with --input and workflow ID schedule:<name>:<fire time in UTC, RFC 3339>.
--overlap skip (default), allow or buffer_one decides what a fire does while the previous
run is active; after downtime, fires younger than --catchup-window start in order and
older ones are recorded as skipped. Daylight saving follows ISC cron (see docs/time.md).`,
		Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, e backend, args []string) error {
			spec.Name = args[0]
			if spec.Cron == "" || spec.Workflow == "" {
				return &usageError{fmt.Errorf("schedules %s needs --cron and --workflow", verb)}
			}
			if input != "" {
				if err := checkJSON("--input", []byte(input)); err != nil {
					return err
				}
				spec.Input = json.RawMessage(input)
			}
			save := e.CreateSchedule
			if verb == "update" {
				save = e.UpdateSchedule
			}
			s, err := save(ctx, spec)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return writeJSON(g.opts.Stdout, s)
			}
			g.printSchedule(s)
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&spec.Cron, "cron", "", "cron expression or descriptor (required)")
	f.StringVar(&spec.TimeZone, "time-zone", "UTC", "IANA time zone of the expression")
	f.StringVar(&spec.Workflow, "workflow", "", "workflow each fire starts (required)")
	f.StringVar(&input, "input", "", "the runs' input, JSON (default null)")
	f.StringVar(&spec.Overlap, "overlap", engine.OverlapSkip, "skip, allow or buffer_one")
	f.DurationVar(&spec.CatchupWindow, "catchup-window", engine.DefaultCatchupWindow, "how old a missed fire may be and still start")
	f.BoolVar(&spec.Paused, "paused", false, "save it paused (an update never resumes a paused schedule: use resume)")
	return cmd
}

func (g *global) printSchedule(s *engine.Schedule) {
	t := newTable(g.opts.Stdout, "NAME", "CRON", "TIME ZONE", "WORKFLOW", "OVERLAP", "CATCH-UP", "PAUSED", "NEXT FIRE")
	t.row(s.Name, s.Cron, s.TimeZone, s.Workflow, s.Overlap, s.CatchupWindow, s.Paused, s.NextFireAt)
	t.flush()
}
