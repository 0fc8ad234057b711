package commands

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/httpapi"
)

func (g *global) deadCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "dead", Short: "Inspect, replay and discard dead jobs"}
	var p engine.ListDeadJobsParams
	var runID string
	list := &cobra.Command{
		Use: "list", Short: "List dead jobs, newest first", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkLimit(p.Limit); err != nil {
				return err
			}
			p.RunID = uuid.Nil
			if runID != "" {
				id, err := parseID("--run-id", runID)
				if err != nil {
					return err
				}
				p.RunID = id
			}
			if err := checkOneOf("--reason", p.Reason, engine.DeadReasons()...); err != nil {
				return err
			}
			e, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			jobs, next, err := e.ListDeadJobs(cmd.Context(), p)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return writeJSON(g.opts.Stdout, httpapi.NewDeadJobList(jobs, next))
			}
			t := newTable(g.opts.Stdout, "ID", "RUN ID", "WORKFLOW", "REASON", "STEP", "ATTEMPTS", "PARKED", "RESOLUTION", "ERROR")
			for _, j := range jobs {
				t.row(j.ID, j.RunID, j.WorkflowName, j.Reason, j.StepName, j.Attempts, j.ParkedAt, j.Resolution, string(j.ErrorClass)+": "+j.ErrorMessage)
			}
			t.flush()
			if next != "" {
				fmt.Fprintf(g.opts.Stdout, "more: --cursor %s\n", serverText(next, 400))
			}
			return nil
		},
	}
	list.Flags().StringVar(&runID, "run-id", "", "only the dead jobs of this run")
	list.Flags().StringVar(&p.Workflow, "workflow", "", "only this workflow")
	list.Flags().StringVar((*string)(&p.Reason), "reason", "", "only this reason")
	list.Flags().BoolVar(&p.OpenOnly, "open", false, "only jobs not yet replayed or discarded")
	list.Flags().IntVar(&p.Limit, "limit", 50, "page size (1..1000)")
	list.Flags().StringVar(&p.Cursor, "cursor", "", "the next page's cursor")

	show := &cobra.Command{
		Use: "show ID", Short: "Show a dead job with its input, error and stack", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withDeadJob(cmd.Context(), args[0], func(e backend, id uuid.UUID) (*engine.DeadJob, error) {
				return e.GetDeadJob(cmd.Context(), id)
			})
		},
	}
	var by, note string
	var version int
	replay := &cobra.Command{
		Use: "replay ID", Short: "Run a dead job's run again: recorded steps stay, the failed step retries", Args: cobra.ExactArgs(1),
		Long: `Run a dead job's run again: recorded steps stay, the failed step retries.

--version N moves the run to version N of its workflow first: the repair of runs a deploy
parked as nondeterminism, once a version whose code replays their steps (the old code behind
engine.Patched) is registered. The run replays its recorded steps through that version's code.
A version that no live engine process on the run's queue registers is refused: deploy it first.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("version") && version < 1 {
				return &usageError{fmt.Errorf("--version: %d is not a workflow version (1 or more)", version)}
			}
			return g.withDeadJob(cmd.Context(), args[0], func(e backend, id uuid.UUID) (*engine.DeadJob, error) {
				return e.ReplayDeadJob(cmd.Context(), id, &engine.ResolveOpts{By: by, Note: note, Version: version})
			})
		},
	}
	replay.Flags().IntVar(&version, "version", 0, "move the run to this version of its workflow before it runs again (default: its own)")
	discard := &cobra.Command{
		Use: "discard ID", Short: "Close a dead job without running it again", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withDeadJob(cmd.Context(), args[0], func(e backend, id uuid.UUID) (*engine.DeadJob, error) {
				return e.DiscardDeadJob(cmd.Context(), id, &engine.ResolveOpts{By: by, Note: note})
			})
		},
	}
	for _, c := range []*cobra.Command{replay, discard} {
		c.Flags().StringVar(&by, "by", "", "who resolves it (recorded)")
		c.Flags().StringVar(&note, "note", "", "why (recorded)")
	}
	cmd.AddCommand(list, show, replay, discard, g.deadMatchingCmd(true), g.deadMatchingCmd(false))
	return cmd
}

func (g *global) withDeadJob(ctx context.Context, arg string, do func(backend, uuid.UUID) (*engine.DeadJob, error)) error {
	id, perr := parseID("dead job ID", arg)
	e, done, err := g.client(ctx)
	if err != nil {
		if perr != nil {
			return perr
		}
		return err
	}
	defer done()
	if perr != nil {
		// An operator often has the workflow ID at hand: name its run's
		// dead job (the action itself takes the dead job's ID).
		if runID, ferr := e.FindRun(ctx, arg); ferr == nil {
			if jobs, _, lerr := e.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: runID, Limit: 1}); lerr == nil && len(jobs) > 0 {
				return &usageError{fmt.Errorf("%w; %s is a workflow ID, and its run's latest dead job is %s", perr.(*usageError).err, text(arg), jobs[0].ID)}
			}
		}
		return perr
	}
	j, err := do(e, id)
	if errors.Is(err, engine.ErrNotFound) {
		// An operator often has the run's ID at hand: name its dead job.
		if jobs, _, lerr := e.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: id, Limit: 1}); lerr == nil && len(jobs) > 0 {
			return fmt.Errorf("%w; %s is a run's ID, and its latest dead job is %s", err, id, jobs[0].ID)
		}
	}
	if err != nil {
		return err
	}
	if g.jsonOut {
		return writeJSON(g.opts.Stdout, j)
	}
	w := g.opts.Stdout
	fmt.Fprintf(w, "dead job %s\n  run          %s (engine runs show %s)\n  workflow     %s (version %d), workflow id %s\n  reason       %s\n",
		j.ID, j.RunID, j.RunID, cell(j.WorkflowName), j.WorkflowVersion, text(j.WorkflowID), cell(j.Reason))
	switch {
	case j.StepName != "" && j.Seq != nil:
		fmt.Fprintf(w, "  step         %s (seq %d), %d attempts\n", cell(j.StepName), *j.Seq, j.Attempts)
	case j.Attempts > 0:
		fmt.Fprintf(w, "  attempts     %d\n", j.Attempts)
	}
	fmt.Fprintf(w, "  failed       %s .. %s\n  error        %s: %s\n",
		cell(j.FirstFailedAt), cell(j.LastFailedAt), cell(j.ErrorClass), oneLine(j.ErrorMessage, 2000))
	if j.ForwardError != nil {
		fmt.Fprintf(w, "  compensating %s: %s (the failure that started the compensation)\n", cell(j.ForwardError.Class), oneLine(j.ForwardError.Message, 2000))
	}
	if j.ParentRunID != nil && j.ParentDeadJobID != nil {
		fmt.Fprintf(w, "  parent       run %s waits for this run, parked as dead job %s (replaying either dead job replays both)\n",
			*j.ParentRunID, *j.ParentDeadJobID)
	}
	if j.ChildRunID != nil && j.ChildDeadJobID != nil {
		fmt.Fprintf(w, "  child        run %s, dead job %s (replaying either dead job replays both)\n", *j.ChildRunID, *j.ChildDeadJobID)
	}
	fmt.Fprintf(w, "  deliveries   %d\n  input        %s\n  parked       %s\n", j.Deliveries, oneLine(string(j.Input), 400), cell(j.ParkedAt))
	if j.Resolution != "" {
		fmt.Fprintf(w, "  resolution   %s by %s at %s: %s\n", cell(j.Resolution), cell(j.ResolvedBy), cell(j.ResolvedAt), cell(j.Note))
	}
	if j.Stack != "" {
		fmt.Fprintf(w, "\n%s\n", escapeControls(j.Stack, true))
	}
	return nil
}

// deadMatchingCmd is dead replay-matching (replay) or discard-matching:
// resolve every open dead job a filter matches.
func (g *global) deadMatchingCmd(replay bool) *cobra.Command {
	var p engine.ListDeadJobsParams
	var opts engine.ResolveOpts
	var dry bool
	var versionSet bool // --version given, checked before the client is made
	verb, use := "Discard", "discard-matching"
	if replay {
		verb, use = "Replay", "replay-matching"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: verb + " every open dead job --workflow and --reason match (at most 10,000; --dry-run counts them)",
		Args:  cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, e backend, _ []string) error {
			if p.Workflow == "" && p.Reason == "" {
				return &usageError{fmt.Errorf("give --workflow or --reason (or both): %s acts on every open dead job they match", use)}
			}
			if versionSet && opts.Version < 1 {
				return &usageError{fmt.Errorf("--version: %d is not a workflow version (1 or more)", opts.Version)}
			}
			act := e.DiscardDeadJobs
			if replay {
				act = e.ReplayDeadJobs
			}
			res, err := act(ctx, engine.ResolveDeadJobsParams{Filter: p, DryRun: dry}, &opts)
			if err != nil {
				return err
			}
			return g.printBulk(res, map[bool]string{true: "replayed", false: "discarded"}[replay], "dead jobs")
		}),
	}
	cmd.Flags().StringVar(&p.Workflow, "workflow", "", "only dead jobs of this workflow")
	cmd.Flags().StringVar((*string)(&p.Reason), "reason", "", "only dead jobs with this reason")
	cmd.Flags().StringVar(&opts.By, "by", "", "who resolves them (kept with each)")
	cmd.Flags().StringVar(&opts.Note, "note", "", "a note kept with each")
	cmd.Flags().BoolVar(&dry, "dry-run", false, "count what would be resolved; resolve nothing")
	if replay {
		cmd.Flags().IntVar(&opts.Version, "version", 0, "move each run to this version of the --workflow before it runs again (default: its own)")
		cmd.PreRun = func(cmd *cobra.Command, _ []string) { versionSet = cmd.Flags().Changed("version") }
	}
	return cmd
}

// printBulk prints a bulk action's counts.
func (g *global) printBulk(res engine.BulkResult, did, what string) error {
	if g.jsonOut {
		return writeJSON(g.opts.Stdout, res)
	}
	if res.DryRun {
		fmt.Fprintf(g.opts.Stdout, "%d %s match (dry run: nothing %s)\n", res.Matched, what, did)
	} else {
		fmt.Fprintf(g.opts.Stdout, "%d %s matched: %d %s, %d skipped (changed meanwhile)\n", res.Matched, what, res.Done, did, res.Skipped)
	}
	if res.More {
		fmt.Fprintln(g.opts.Stdout, "more match than one action takes (10,000): run it again")
	}
	return nil
}
