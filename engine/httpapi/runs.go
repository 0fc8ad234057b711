package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine"
)

// startRequest is the body of POST /v1/workflows/{name}/runs: the workflow
// ID, the input, and optionally a start time (RFC 3339) or a delay (a
// duration such as "90s" or "1h30m") to start the run later.
type startRequest struct {
	ID         string          `json:"id"`
	Input      json.RawMessage `json:"input"`
	StartAt    time.Time       `json:"start_at"`
	Delay      string          `json:"delay"`
	RunTimeout string          `json:"run_timeout"`
	// Tags label the run (StartOpts.Tags): {"customer": "c_42"}.
	Tags map[string]string `json:"tags"`
	// Flow control (StartOpts): the queue (instead of the workflow's),
	// the run's key in it, its priority, its key's weight, and a
	// deduplication ID, refused (409 duplicate) or, with
	// return_duplicate, answered with the run that holds it.
	Queue           string  `json:"queue"`
	QueueKey        string  `json:"queue_key"`
	Priority        int     `json:"priority"`
	KeyWeight       float64 `json:"key_weight"`
	DeduplicationID string  `json:"deduplication_id"`
	ReturnDuplicate bool    `json:"return_duplicate"`
	// Debounce collapses starts with one key within a window into one
	// run with the latest input (StartOpts.Debounce): durations such as
	// "1s".
	Debounce *debounceRequest `json:"debounce"`
}

// debounceRequest is a start's "debounce" object.
type debounceRequest struct {
	Key     string `json:"key"`
	Window  string `json:"window"`
	MaxWait string `json:"max_wait"`
}

const startShape = `{"id": string, "input": any JSON, "start_at": RFC 3339 time, "delay": duration such as "90s", "run_timeout": duration, "tags": {"key": "value"}, ` +
	`"queue": string, "queue_key": string, "priority": integer, "key_weight": number, "deduplication_id": string, "return_duplicate": boolean, "debounce": {"key": string, "window": duration, "max_wait": duration}}`

// opts is the request's StartOpts.
func (req *startRequest) opts() (*engine.StartOpts, error) {
	opts := &engine.StartOpts{WorkflowID: req.ID, StartAt: req.StartAt, Tags: req.Tags, Queue: req.Queue, QueueKey: req.QueueKey,
		Priority: req.Priority, KeyWeight: req.KeyWeight, DeduplicationID: req.DeduplicationID, ReturnDuplicate: req.ReturnDuplicate}
	for _, f := range []struct {
		name, value string
		to          *time.Duration
	}{{"delay", req.Delay, &opts.Delay}, {"run_timeout", req.RunTimeout, &opts.RunTimeout}} {
		if f.value == "" {
			continue
		}
		d, err := time.ParseDuration(f.value)
		if err != nil {
			return nil, fmt.Errorf("%w: %s %.40q is not a duration such as \"90s\" or \"1h30m\"", engine.ErrInvalidArgument, f.name, f.value)
		}
		*f.to = d
	}
	if db := req.Debounce; db != nil {
		opts.Debounce = &engine.Debounce{Key: db.Key}
		for _, f := range []struct {
			name, value string
			to          *time.Duration
		}{{"debounce.window", db.Window, &opts.Debounce.Window}, {"debounce.max_wait", db.MaxWait, &opts.Debounce.MaxWait}} {
			if f.value == "" {
				continue
			}
			d, err := time.ParseDuration(f.value)
			if err != nil {
				return nil, fmt.Errorf("%w: %s %.40q is not a duration such as \"90s\" or \"1h30m\"", engine.ErrInvalidArgument, f.name, f.value)
			}
			*f.to = d
		}
	}
	return opts, nil
}

func (a *api) startRun(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var req startRequest
	if !a.readJSON(w, r, &req, startShape) {
		return
	}
	opts, err := req.opts()
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	res, err := a.e.StartJSON(r.Context(), name, req.Input, opts)
	a.writeStart(w, r, name, res, err)
}

// writeStart answers a start: 201 with the new run, 200 with the run that
// existed, or the error.
func (a *api) writeStart(w http.ResponseWriter, r *http.Request, name string, res *engine.StartResult, err error) {
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	status := http.StatusCreated
	if res.Existing {
		status = http.StatusOK
	}
	writeJSON(w, status, NewStartResponse(name, res))
}

// signalWithStartRequest is the body of POST
// /v1/workflows/{name}/signal-with-start: a start's fields (the workflow ID
// required) and the signal to send.
type signalWithStartRequest struct {
	startRequest
	Signal  string          `json:"signal"`
	Payload json.RawMessage `json:"payload"`
}

// signalWithStart signals the run with the body's workflow ID, starting it
// first if there is none: 201 started, 200 existed (signalled), 409 run
// finished or key used for another signal, 404 unknown workflow, 400 bad
// input, signal name, key or payload.
func (a *api) signalWithStart(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	sopts, ok := signalOpts(w, r)
	if !ok {
		return
	}
	var req signalWithStartRequest
	if !a.readJSON(w, r, &req, `{"id": string, "input": any JSON, "signal": string, "payload": any JSON, "start_at": RFC 3339 time, "delay": duration, "run_timeout": duration, "tags": {"key": "value"}}`) {
		return
	}
	opts, err := req.opts()
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	if len(req.Payload) == 0 {
		req.Payload = json.RawMessage("null")
	}
	res, err := a.e.SignalWithStartJSON(r.Context(), engine.SignalWithStartJSONParams{Workflow: name, Input: req.Input, Opts: opts,
		Signal: req.Signal, Payload: req.Payload, SignalOpts: sopts})
	a.writeStart(w, r, name, res, err)
}

// getRun takes a run ID or a workflow ID, as cancel and signal do.
// getRun answers GET /v1/runs/{run_id}: the whole run, or with
// steps_from=N, signals=false and payloads=false only what a follower
// needs (see engine.GetRunOpts).
func (a *api) getRun(w http.ResponseWriter, r *http.Request) {
	q, ok := queryParams(w, r, "steps_from", "signals", "payloads")
	if !ok {
		return
	}
	var opts engine.GetRunOpts
	if v := q.Get("steps_from"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > math.MaxInt32 {
			writeError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("steps_from %q is not a step position (0 or more)", truncate(v, 64)))
			return
		}
		opts.StepsFrom = n
	}
	for _, f := range []struct {
		name string
		off  *bool
	}{{"signals", &opts.NoSignals}, {"payloads", &opts.NoPayloads}} {
		if v := q.Get(f.name); v != "" {
			on, err := strconv.ParseBool(v)
			if err != nil {
				writeError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("%s %q is not true or false", f.name, truncate(v, 64)))
				return
			}
			*f.off = !on
		}
	}
	id, err := a.e.FindRun(r.Context(), r.PathValue("run_id"))
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	run, err := a.e.GetRunWith(r.Context(), id, &opts)
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, run)
}

func (a *api) listRuns(w http.ResponseWriter, r *http.Request) {
	q, ok := queryParams(w, r, "workflow", "status", "workflow_id_prefix", "limit", "cursor",
		"created_after", "created_before", "finished_after", "finished_before", "tag", "top_level", "patched", "unpatched", "workflow_version")
	if !ok {
		return
	}
	topLevel := false
	if v := q.Get("top_level"); v != "" {
		var err error
		if topLevel, err = strconv.ParseBool(v); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("top_level %q is not true or false", truncate(v, 64)))
			return
		}
	}
	tags, err := ParseTags(q["tag"])
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	limit, ok := queryLimit(w, r)
	if !ok {
		return
	}
	version := 0
	if v := q.Get("workflow_version"); v != "" {
		var err error
		if version, err = strconv.Atoi(v); err != nil || version < 1 {
			writeError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("workflow_version %q is not a version (1 or more)", truncate(v, 64)))
			return
		}
	}
	p := engine.ListRunsParams{Version: version,
		Workflow: q.Get("workflow"), Status: engine.RunStatus(q.Get("status")), WorkflowIDPrefix: q.Get("workflow_id_prefix"),
		Limit: limit, Cursor: q.Get("cursor"), Tags: tags, TopLevel: topLevel,
		Patched: q.Get("patched"), Unpatched: q.Get("unpatched"),
	}
	for name, dst := range map[string]*time.Time{"created_after": &p.CreatedAfter, "created_before": &p.CreatedBefore,
		"finished_after": &p.FinishedAfter, "finished_before": &p.FinishedBefore} {
		if v := q.Get(name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				writeError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("%s %q is not an RFC 3339 time such as 2026-12-01T00:00:00Z", name, truncate(v, 64)))
				return
			}
			*dst = t
		}
	}
	runs, next, err := a.e.ListRuns(r.Context(), p)
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, NewRunList(runs, next))
}

// cancelRun takes a run ID or a workflow ID, as signal and the CLI do.
func (a *api) cancelRun(w http.ResponseWriter, r *http.Request) {
	if run, ok := a.runAction(w, r, a.e.Cancel); ok {
		writeJSON(w, http.StatusAccepted, NewCancelResponse(run))
	}
}

// WorkflowList is GET /v1/workflows's body.
type WorkflowList struct {
	Workflows []engine.WorkflowInfo `json:"workflows"`
}

// listWorkflows answers what live engine processes register
// (Engine.ListWorkflows).
func (a *api) listWorkflows(w http.ResponseWriter, r *http.Request) {
	if _, ok := queryParams(w, r); !ok {
		return
	}
	wfs, err := a.e.ListWorkflows(r.Context())
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, WorkflowList{Workflows: wfs})
}

// TerminateRequest is POST /v1/runs/{run_id}/terminate's body.
type TerminateRequest struct {
	Reason string `json:"reason"`
	By     string `json:"by,omitempty"`
}

// terminateRun ends a run at once without compensations (Engine.Terminate):
// 200 with the run, 404 unknown run, 409 run finished, 400 no reason or a
// reason or by Engine.Terminate refuses.
func (a *api) terminateRun(w http.ResponseWriter, r *http.Request) {
	var req TerminateRequest
	if !a.readJSON(w, r, &req, `{"reason": "...", "by": "..."}`) {
		return
	}
	terminate := func(ctx context.Context, id uuid.UUID) error {
		return a.e.Terminate(ctx, id, &engine.TerminateOpts{Reason: req.Reason, By: req.By})
	}
	if run, ok := a.runAction(w, r, terminate); ok {
		writeJSON(w, http.StatusOK, run)
	}
}

// startNow starts a delayed run at once: 200 with the run, 404 unknown
// run, 409 run finished, 400 a run that has started.
func (a *api) startNow(w http.ResponseWriter, r *http.Request) {
	if run, ok := a.runAction(w, r, a.e.StartNow); ok {
		writeJSON(w, http.StatusOK, run)
	}
}

// runAction applies act to the run the path names (a run ID or a
// workflow ID) and reads the run after it; false when it answered an error.
func (a *api) runAction(w http.ResponseWriter, r *http.Request, act func(context.Context, uuid.UUID) error) (*engine.Run, bool) {
	id, err := a.e.FindRun(r.Context(), r.PathValue("run_id"))
	if err == nil {
		err = act(r.Context(), id)
	}
	var run *engine.Run
	if err == nil {
		run, err = a.e.GetRun(r.Context(), id)
	}
	if err != nil {
		a.engineError(w, r, err)
		return nil, false
	}
	return run, true
}

// signal sends the request body (one JSON value; empty means null) as a
// signal to the run, named by run ID or workflow ID, with the request's
// Idempotency-Key header (if any) as the signal's key: 202 when buffered
// (or a retry of a keyed signal), 404 unknown run, 409 run finished or key
// used for another signal, 400 bad name, key or payload.
func (a *api) signal(w http.ResponseWriter, r *http.Request) {
	target, name := r.PathValue("run_id"), r.PathValue("name")
	opts, ok := signalOpts(w, r)
	if !ok {
		return
	}
	body, ok := a.readBody(w, r)
	if !ok {
		return
	}
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("null")
	}
	if err := a.e.SignalJSON(r.Context(), target, name, body, opts); err != nil {
		a.engineError(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, SignalResponse{Run: target, Signal: name, Status: "accepted"})
}

// signalOpts reads the signal's idempotency key from the Idempotency-Key
// header (Stripe's name for it); a header given twice is refused.
func signalOpts(w http.ResponseWriter, r *http.Request) (*engine.SignalOpts, bool) {
	keys := r.Header.Values("Idempotency-Key")
	switch len(keys) {
	case 0:
		return nil, true
	case 1:
		return &engine.SignalOpts{Key: keys[0]}, true
	}
	writeError(w, http.StatusBadRequest, "invalid_parameter", "header Idempotency-Key is given more than once")
	return nil, false
}

func pathUUID(w http.ResponseWriter, r *http.Request, key string) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PathValue(key))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("%s %q is not a UUID", key, r.PathValue(key)))
		return uuid.Nil, false
	}
	return id, true
}

// queryParams returns the request's query parameters when each is one of
// allowed and given once; otherwise it answers 400 invalid_parameter
// naming the parameter, so a misspelt filter (?stauts=dead) is refused
// instead of ignored, which would list everything.
func queryParams(w http.ResponseWriter, r *http.Request, allowed ...string) (url.Values, bool) {
	q := r.URL.Query()
	for _, k := range slices.Sorted(maps.Keys(q)) {
		switch {
		case !slices.Contains(allowed, k):
			takes := "no query parameters"
			if len(allowed) > 0 {
				takes = "only " + strings.Join(allowed, ", ")
			}
			writeError(w, http.StatusBadRequest, "invalid_parameter",
				fmt.Sprintf("unknown query parameter %q: %s %s takes %s", truncate(k, 100), r.Method, r.URL.Path, takes))
			return nil, false
		case len(q[k]) > 1 && k != "tag": // the one list filter that repeats
			writeError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("query parameter %q is given %d times", k, len(q[k])))
			return nil, false
		}
	}
	return q, true
}

// truncate keeps at most n bytes of s, on a character boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func queryLimit(w http.ResponseWriter, r *http.Request) (int, bool) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return 0, true
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("limit %q is not an integer", v))
		return 0, false
	}
	if n < 1 || n > 1000 {
		writeError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("limit %d is outside 1..1000", n))
		return 0, false
	}
	return n, true
}

// BulkCancelRequest is POST /v1/bulk/cancel-runs's body: the runs to
// cancel, as GET /v1/runs filters them (times in RFC 3339).
type BulkCancelRequest struct {
	Workflow         string            `json:"workflow,omitempty"`
	Status           engine.RunStatus  `json:"status,omitempty"`
	WorkflowIDPrefix string            `json:"workflow_id_prefix,omitempty"`
	CreatedAfter     time.Time         `json:"created_after,omitzero"`
	CreatedBefore    time.Time         `json:"created_before,omitzero"`
	Tags             map[string]string `json:"tags,omitempty"`
	// TopLevel leaves out child runs (see engine.ListRunsParams.TopLevel).
	TopLevel bool `json:"top_level,omitempty"`
	// WorkflowVersion keeps the runs of this version (0: any); Patched
	// and Unpatched those that did and did not take a change (see
	// engine.ListRunsParams).
	WorkflowVersion int    `json:"workflow_version,omitempty"`
	Patched         string `json:"patched,omitempty"`
	Unpatched       string `json:"unpatched,omitempty"`
	DryRun          bool   `json:"dry_run,omitempty"`
}

// bulkCancel cancels the active runs a filter matches (Engine.CancelRuns):
// 200 with the counts.
func (a *api) bulkCancel(w http.ResponseWriter, r *http.Request) {
	var req BulkCancelRequest
	if !a.readJSON(w, r, &req, `{"workflow": "...", "status": "...", "workflow_id_prefix": "...", "created_after": "...", "created_before": "...", "tags": {"key": "value"}, "top_level": true, "workflow_version": 1, "patched": "...", "unpatched": "...", "dry_run": true}`) {
		return
	}
	res, err := a.e.CancelRuns(r.Context(), engine.CancelRunsParams{Filter: engine.ListRunsParams{Workflow: req.Workflow, Status: req.Status,
		WorkflowIDPrefix: req.WorkflowIDPrefix, CreatedAfter: req.CreatedAfter, CreatedBefore: req.CreatedBefore, Tags: req.Tags, TopLevel: req.TopLevel,
		Version: req.WorkflowVersion, Patched: req.Patched, Unpatched: req.Unpatched},
		DryRun: req.DryRun})
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// BulkDeadJobsRequest is the body of POST /v1/bulk/replay-dead-jobs and
// /v1/bulk/discard-dead-jobs: the open dead jobs to resolve, as GET
// /v1/dead-jobs filters them, and the resolution's by and note.
type BulkDeadJobsRequest struct {
	Workflow string            `json:"workflow,omitempty"`
	Reason   engine.DeadReason `json:"reason,omitempty"`
	By       string            `json:"by,omitempty"`
	Note     string            `json:"note,omitempty"`
	// WorkflowVersion, for a replay (with workflow), moves each run to
	// that version first (engine.ResolveOpts.Version).
	WorkflowVersion int  `json:"workflow_version,omitempty"`
	DryRun          bool `json:"dry_run,omitempty"`
}

// bulkDeadJobs replays (or discards) the open dead jobs a filter matches:
// 200 with the counts.
func (a *api) bulkDeadJobs(replay bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req BulkDeadJobsRequest
		if !a.readJSON(w, r, &req, `{"workflow": "...", "reason": "...", "by": "...", "note": "...", "workflow_version": 2, "dry_run": true}`) {
			return
		}
		act := a.e.DiscardDeadJobs
		if replay {
			act = a.e.ReplayDeadJobs
		}
		res, err := act(r.Context(), engine.ResolveDeadJobsParams{Filter: engine.ListDeadJobsParams{Workflow: req.Workflow, Reason: req.Reason},
			DryRun: req.DryRun}, &engine.ResolveOpts{By: req.By, Note: req.Note, Version: req.WorkflowVersion})
		if err != nil {
			a.engineError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, res)
	}
}

// ParseTags reads tag filters written "key:value" or "key=value" (the
// query parameter tag, repeated; the CLI's --tag) into a map; nil for none.
// A key cannot hold ':' or '=', so the first of them splits. Errors wrap
// engine.ErrInvalidArgument: a filter without a separator, a key given
// twice, more than engine.MaxTags.
func ParseTags(specs []string) (map[string]string, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	if len(specs) > engine.MaxTags {
		return nil, fmt.Errorf("%w: %d tag filters; at most %d", engine.ErrInvalidArgument, len(specs), engine.MaxTags)
	}
	out := make(map[string]string, len(specs))
	for _, s := range specs {
		i := strings.IndexAny(s, ":=")
		if i < 0 {
			return nil, fmt.Errorf("%w: tag filter %q is not key:value (or key=value)", engine.ErrInvalidArgument, truncate(s, 64))
		}
		k, v := s[:i], s[i+1:]
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%w: tag %q is filtered twice", engine.ErrInvalidArgument, truncate(k, 64))
		}
		out[k] = v
	}
	return out, nil
}

// PruneRequest is the body of POST /v1/runs/prune: delete the finished
// runs that ended longer ago than OlderThan (a duration such as "720h"),
// or with DryRun count them (Engine.Prune).
type PruneRequest struct {
	OlderThan string `json:"older_than"`
	DryRun    bool   `json:"dry_run,omitempty"`
}

func (a *api) pruneRuns(w http.ResponseWriter, r *http.Request) {
	var req PruneRequest
	if !a.readJSON(w, r, &req, `{"older_than": "720h", "dry_run": true}`) {
		return
	}
	d, err := time.ParseDuration(req.OlderThan)
	switch {
	case err != nil || d <= 0:
		writeError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("older_than %q is not a positive duration such as \"720h\"", truncate(req.OlderThan, 64)))
		return
	case d < engine.MinRetention:
		writeError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("older_than %s is below the %s minimum: a run that just ended is kept at least that long", d, engine.MinRetention))
		return
	}
	res, err := a.e.Prune(r.Context(), engine.PruneParams{OlderThan: d, DryRun: req.DryRun})
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
