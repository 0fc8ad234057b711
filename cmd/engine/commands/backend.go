package commands

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/httpapi"
)

// backend is what the operator commands need: an *engine.Engine on the
// database, or apiClient, a running server's HTTP API (--address). Both
// answer with the engine's types and sentinel errors, so a command prints
// and exits the same either way.
type backend interface {
	FindRun(ctx context.Context, runOrWorkflowID string) (uuid.UUID, error)
	GetRun(ctx context.Context, runID uuid.UUID) (*engine.Run, error)
	GetRunWith(ctx context.Context, runID uuid.UUID, opts *engine.GetRunOpts) (*engine.Run, error)
	ListRuns(ctx context.Context, p engine.ListRunsParams) ([]*engine.Run, string, error)
	StartJSON(ctx context.Context, name string, input json.RawMessage, opts *engine.StartOpts) (*engine.StartResult, error)
	StartNow(ctx context.Context, runID uuid.UUID) error
	Cancel(ctx context.Context, runID uuid.UUID) error
	Terminate(ctx context.Context, runID uuid.UUID, opts *engine.TerminateOpts) error
	CancelRuns(ctx context.Context, p engine.CancelRunsParams) (engine.BulkResult, error)
	Prune(ctx context.Context, p engine.PruneParams) (engine.PruneResult, error)
	SignalJSON(ctx context.Context, target, name string, payload []byte, opts *engine.SignalOpts) error
	SignalWithStartJSON(ctx context.Context, p engine.SignalWithStartJSONParams) (*engine.StartResult, error)
	ListWorkflows(ctx context.Context) ([]engine.WorkflowInfo, error)
	ListDeadJobs(ctx context.Context, p engine.ListDeadJobsParams) ([]*engine.DeadJob, string, error)
	GetDeadJob(ctx context.Context, id uuid.UUID) (*engine.DeadJob, error)
	ReplayDeadJob(ctx context.Context, id uuid.UUID, opts *engine.ResolveOpts) (*engine.DeadJob, error)
	DiscardDeadJob(ctx context.Context, id uuid.UUID, opts *engine.ResolveOpts) (*engine.DeadJob, error)
	ReplayDeadJobs(ctx context.Context, p engine.ResolveDeadJobsParams, opts *engine.ResolveOpts) (engine.BulkResult, error)
	DiscardDeadJobs(ctx context.Context, p engine.ResolveDeadJobsParams, opts *engine.ResolveOpts) (engine.BulkResult, error)
	ListSchedules(ctx context.Context) ([]engine.Schedule, error)
	GetSchedule(ctx context.Context, name string) (*engine.Schedule, error)
	ListScheduleFires(ctx context.Context, name string, limit int) ([]engine.ScheduleFire, error)
	CreateSchedule(ctx context.Context, spec engine.ScheduleSpec) (*engine.Schedule, error)
	UpdateSchedule(ctx context.Context, spec engine.ScheduleSpec) (*engine.Schedule, error)
	PauseSchedule(ctx context.Context, name string) error
	ResumeSchedule(ctx context.Context, name string) error
	DeleteSchedule(ctx context.Context, name string) error
	TriggerSchedule(ctx context.Context, name string) (*engine.StartResult, error)
	ListQueues(ctx context.Context) ([]engine.QueueInfo, error)
	PauseQueue(ctx context.Context, name string, opts *engine.PauseOpts) error
	ResumeQueue(ctx context.Context, name, by string) error
}

var _ backend = (*engine.Engine)(nil)

// apiClient is backend over a running server's HTTP API.
type apiClient struct {
	base  string // "http://host:port"
	token string
	http  *http.Client
}

// newAPIClient reads --address: "host:port" or an http(s) URL.
func newAPIClient(address, token string) (*apiClient, error) {
	if !strings.Contains(address, "://") {
		address = "http://" + address
	}
	u, err := url.Parse(address)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" ||
		(u.Port() == "" && !strings.HasPrefix(address, "https://")) {
		return nil, &usageError{fmt.Errorf("--address %q is not host:port or an http(s)://host:port URL", address)}
	}
	return &apiClient{base: u.Scheme + "://" + u.Host, token: token, http: &http.Client{
		Timeout: 2 * time.Minute,
		// A redirect is not followed: Go's client would resend the API
		// token to another port of the host, and over http after https.
		// do reports it instead.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}, nil
}

// apiError is an error answer of the API: its message, with the engine
// sentinel its code stands for (so errors.Is and the exit code work as
// they do on the database).
type apiError struct {
	status   int
	code     string
	message  string
	sentinel error
}

// Error is the message, as the server sent it but escaped (serverText):
// it reaches the operator's terminal.
func (e *apiError) Error() string { return serverText(e.message, maxServerMessage) }

func (e *apiError) Unwrap() error { return e.sentinel }

// maxServerMessage bounds the bytes of a server's error message the CLI
// prints.
const maxServerMessage = 4000

var sentinels = map[string]error{
	"not_found": engine.ErrNotFound, "unknown_workflow": engine.ErrUnknownWorkflow, "invalid_input": engine.ErrInvalidInput,
	"workflow_id_conflict": engine.ErrWorkflowIDConflict, "schedule_exists": engine.ErrScheduleExists,
	"run_closed": engine.ErrRunClosed, "run_not_finished": engine.ErrRunNotFinished, "signal_key_conflict": engine.ErrSignalKeyConflict,
	"limit_exceeded": engine.ErrLimitExceeded, "dead_job_resolved": engine.ErrDeadJobResolved,
	"invalid_parameter": engine.ErrInvalidArgument, "invalid_json": engine.ErrInvalidArgument,
	"payload_too_large": engine.ErrInvalidInput, "duplicate": engine.ErrDuplicate,
}

// do sends a request (body: nil, raw JSON bytes, or a value to encode) and
// decodes a 2xx answer into out (nil: ignore it).
func (c *apiClient) do(ctx context.Context, method, path string, query url.Values, body any, header http.Header, out any) error {
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		r = bytes.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			return err
		}
		r = bytes.NewReader(buf)
	}
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, r)
	if err != nil {
		return err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if method != http.MethodGet {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return &unreachableError{base: c.base, err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("reading the engine's answer: %w", err)
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return c.redirected(resp, method, path)
	}
	if resp.StatusCode >= 300 {
		var eb httpapi.ErrorBody
		if json.Unmarshal(raw, &eb) != nil || eb.Error.Code == "" {
			return fmt.Errorf("the engine at %s answered %s to %s %s", c.base, statusLine(resp.StatusCode), method, path)
		}
		switch {
		case resp.StatusCode == http.StatusUnauthorized && c.token == "":
			eb.Error.Message = "the engine requires an API token: set --api-token or ENGINE_API_TOKEN"
		case resp.StatusCode == http.StatusUnauthorized:
			eb.Error.Message = "the engine refused the API token (--api-token or ENGINE_API_TOKEN): it is not the one the server was started with"
		}
		return &apiError{status: resp.StatusCode, code: eb.Error.Code, message: eb.Error.Message, sentinel: sentinels[eb.Error.Code]}
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("decoding the engine's answer to %s %s: %w", method, path, err)
	}
	return nil
}

// redirected is the error for a redirect (3xx) the server answered: the
// CLI follows none, as following one would send the API token to where
// the server points (another port, or plain http), so it names the
// status and the Location and says to point --address at the engine
// itself. Exit 1; --json code "redirect".
func (c *apiClient) redirected(resp *http.Response, method, path string) error {
	where := "no Location"
	if loc := resp.Header.Get("Location"); loc != "" {
		where = "Location " + strconv.Quote(cutText(loc, 300))
	}
	return &apiError{status: resp.StatusCode, code: "redirect", message: fmt.Sprintf(
		"the engine at %s answered %s (%s) to %s %s: the CLI follows no redirect, which would send the API token there; "+
			"set --address (or ENGINE_ADDRESS) to the engine's own address", c.base, statusLine(resp.StatusCode), where, method, path)}
}

// statusLine is an HTTP status as "307 Temporary Redirect": the code with
// Go's text for it, not the reason phrase the server sent.
func statusLine(code int) string {
	return strings.TrimSpace(fmt.Sprintf("%d %s", code, http.StatusText(code)))
}

// unreachableError: the request got no answer (the server is down,
// restarting, or too slow for the client's timeout).
type unreachableError struct {
	base string
	err  error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("calling the engine at %s: %s", e.base, serverText(e.err.Error(), maxServerMessage))
}
func (e *unreachableError) Unwrap() error { return e.err }

func runPath(id string) string { return "/v1/runs/" + url.PathEscape(id) }

func (c *apiClient) FindRun(ctx context.Context, target string) (uuid.UUID, error) {
	var run engine.Run
	// Only its ID is needed: no signals, no payloads.
	q := url.Values{"signals": {"false"}, "payloads": {"false"}}
	if err := c.do(ctx, "GET", runPath(target), q, nil, nil, &run); err != nil {
		return uuid.Nil, err
	}
	return run.RunID, nil
}

func (c *apiClient) GetRun(ctx context.Context, id uuid.UUID) (*engine.Run, error) {
	return c.GetRunWith(ctx, id, nil)
}

func (c *apiClient) GetRunWith(ctx context.Context, id uuid.UUID, opts *engine.GetRunOpts) (*engine.Run, error) {
	var q url.Values
	if opts != nil {
		q = url.Values{}
		if opts.StepsFrom > 0 {
			q.Set("steps_from", strconv.Itoa(opts.StepsFrom))
		}
		if opts.NoSignals {
			q.Set("signals", "false")
		}
		if opts.NoPayloads {
			q.Set("payloads", "false")
		}
	}
	var run engine.Run
	if err := c.do(ctx, "GET", runPath(id.String()), q, nil, nil, &run); err != nil {
		return nil, err
	}
	return &run, nil
}

func setTime(q url.Values, k string, t time.Time) {
	if !t.IsZero() {
		q.Set(k, t.UTC().Format(time.RFC3339Nano))
	}
}

func setStr(q url.Values, k, v string) {
	if v != "" {
		q.Set(k, v)
	}
}

func (c *apiClient) ListRuns(ctx context.Context, p engine.ListRunsParams) ([]*engine.Run, string, error) {
	q := url.Values{}
	setStr(q, "workflow", p.Workflow)
	setStr(q, "status", string(p.Status))
	setStr(q, "workflow_id_prefix", p.WorkflowIDPrefix)
	setStr(q, "cursor", p.Cursor)
	if p.Limit != 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	setTime(q, "created_after", p.CreatedAfter)
	setTime(q, "created_before", p.CreatedBefore)
	setTime(q, "finished_after", p.FinishedAfter)
	setTime(q, "finished_before", p.FinishedBefore)
	for k, v := range p.Tags {
		q.Add("tag", k+":"+v)
	}
	if p.TopLevel {
		q.Set("top_level", "true")
	}
	setStr(q, "patched", p.Patched)
	setStr(q, "unpatched", p.Unpatched)
	if p.Version != 0 {
		q.Set("workflow_version", strconv.Itoa(p.Version))
	}
	var list struct {
		Runs       []*engine.Run `json:"runs"`
		NextCursor string        `json:"next_cursor"`
	}
	err := c.do(ctx, "GET", "/v1/runs", q, nil, nil, &list)
	return list.Runs, list.NextCursor, err
}

// startBody is a start's request body (see the API's POST
// /v1/workflows/{name}/runs).
func startBody(input json.RawMessage, opts *engine.StartOpts) map[string]any {
	b := map[string]any{}
	if len(input) > 0 {
		b["input"] = input
	}
	if opts == nil {
		return b
	}
	if opts.WorkflowID != "" {
		b["id"] = opts.WorkflowID
	}
	if !opts.StartAt.IsZero() {
		b["start_at"] = opts.StartAt
	}
	if opts.Delay != 0 {
		b["delay"] = opts.Delay.String()
	}
	if opts.RunTimeout != 0 {
		b["run_timeout"] = opts.RunTimeout.String()
	}
	if len(opts.Tags) > 0 {
		b["tags"] = opts.Tags
	}
	for k, v := range map[string]string{"queue": opts.Queue, "queue_key": opts.QueueKey, "deduplication_id": opts.DeduplicationID} {
		if v != "" {
			b[k] = v
		}
	}
	if opts.Priority != 0 {
		b["priority"] = opts.Priority
	}
	if opts.KeyWeight != 0 {
		b["key_weight"] = opts.KeyWeight
	}
	if opts.ReturnDuplicate {
		b["return_duplicate"] = true
	}
	return b
}

func (c *apiClient) StartJSON(ctx context.Context, name string, input json.RawMessage, opts *engine.StartOpts) (*engine.StartResult, error) {
	var res engine.StartResult
	err := c.do(ctx, "POST", "/v1/workflows/"+url.PathEscape(name)+"/runs", nil, startBody(input, opts), nil, &res)
	return &res, err
}

func (c *apiClient) runAction(ctx context.Context, id uuid.UUID, action string, body any) error {
	if body == nil {
		body = []byte("{}")
	}
	return c.do(ctx, "POST", runPath(id.String())+"/"+action, nil, body, nil, nil)
}

func (c *apiClient) StartNow(ctx context.Context, id uuid.UUID) error {
	return c.runAction(ctx, id, "start-now", nil)
}

func (c *apiClient) Cancel(ctx context.Context, id uuid.UUID) error {
	return c.runAction(ctx, id, "cancel", nil)
}

func (c *apiClient) Terminate(ctx context.Context, id uuid.UUID, opts *engine.TerminateOpts) error {
	if opts == nil {
		opts = &engine.TerminateOpts{} // the server says a reason is required
	}
	return c.runAction(ctx, id, "terminate", map[string]string{"reason": opts.Reason, "by": opts.By})
}

func (c *apiClient) CancelRuns(ctx context.Context, params engine.CancelRunsParams) (engine.BulkResult, error) {
	p, dryRun := params.Filter, params.DryRun
	var res engine.BulkResult
	err := c.do(ctx, "POST", "/v1/bulk/cancel-runs", nil, httpapi.BulkCancelRequest{Workflow: p.Workflow, Status: p.Status,
		WorkflowIDPrefix: p.WorkflowIDPrefix, CreatedAfter: p.CreatedAfter, CreatedBefore: p.CreatedBefore, Tags: p.Tags, TopLevel: p.TopLevel,
		WorkflowVersion: p.Version, Patched: p.Patched, Unpatched: p.Unpatched, DryRun: dryRun}, nil, &res)
	return res, err
}

func (c *apiClient) Prune(ctx context.Context, p engine.PruneParams) (engine.PruneResult, error) {
	var res engine.PruneResult
	err := c.do(ctx, "POST", "/v1/runs/prune", nil, httpapi.PruneRequest{OlderThan: p.OlderThan.String(), DryRun: p.DryRun}, nil, &res)
	return res, err
}

func signalHeader(opts *engine.SignalOpts) http.Header {
	if opts == nil || opts.Key == "" {
		return nil
	}
	return http.Header{"Idempotency-Key": {opts.Key}}
}

func (c *apiClient) SignalJSON(ctx context.Context, target, name string, payload []byte, opts *engine.SignalOpts) error {
	if len(payload) == 0 {
		payload = []byte("null")
	}
	return c.do(ctx, "POST", runPath(target)+"/signals/"+url.PathEscape(name), nil, payload, signalHeader(opts), nil)
}

func (c *apiClient) SignalWithStartJSON(ctx context.Context, p engine.SignalWithStartJSONParams) (*engine.StartResult, error) {
	b := startBody(p.Input, p.Opts)
	b["signal"] = p.Signal
	if len(p.Payload) > 0 {
		b["payload"] = p.Payload
	}
	var res engine.StartResult
	err := c.do(ctx, "POST", "/v1/workflows/"+url.PathEscape(p.Workflow)+"/signal-with-start", nil, b, signalHeader(p.SignalOpts), &res)
	return &res, err
}

func (c *apiClient) ListWorkflows(ctx context.Context) ([]engine.WorkflowInfo, error) {
	var list httpapi.WorkflowList
	err := c.do(ctx, "GET", "/v1/workflows", nil, nil, nil, &list)
	return list.Workflows, err
}

func deadJobQuery(p engine.ListDeadJobsParams) url.Values {
	q := url.Values{}
	setStr(q, "workflow", p.Workflow)
	setStr(q, "reason", string(p.Reason))
	setStr(q, "cursor", p.Cursor)
	if p.RunID != uuid.Nil {
		q.Set("run_id", p.RunID.String())
	}
	if p.OpenOnly {
		q.Set("open", "true")
	}
	if p.Limit != 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	return q
}

func (c *apiClient) ListDeadJobs(ctx context.Context, p engine.ListDeadJobsParams) ([]*engine.DeadJob, string, error) {
	var list struct {
		DeadJobs   []*engine.DeadJob `json:"dead_jobs"`
		NextCursor string            `json:"next_cursor"`
	}
	err := c.do(ctx, "GET", "/v1/dead-jobs", deadJobQuery(p), nil, nil, &list)
	return list.DeadJobs, list.NextCursor, err
}

func (c *apiClient) GetDeadJob(ctx context.Context, id uuid.UUID) (*engine.DeadJob, error) {
	var j engine.DeadJob
	if err := c.do(ctx, "GET", "/v1/dead-jobs/"+id.String(), nil, nil, nil, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

func (c *apiClient) resolve(ctx context.Context, id uuid.UUID, action string, opts *engine.ResolveOpts) (*engine.DeadJob, error) {
	body := map[string]any{}
	if opts != nil {
		body["by"], body["note"] = opts.By, opts.Note
		if opts.Version != 0 {
			body["workflow_version"] = opts.Version
		}
	}
	var j engine.DeadJob
	if err := c.do(ctx, "POST", "/v1/dead-jobs/"+id.String()+"/"+action, nil, body, nil, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

func (c *apiClient) ReplayDeadJob(ctx context.Context, id uuid.UUID, opts *engine.ResolveOpts) (*engine.DeadJob, error) {
	return c.resolve(ctx, id, "replay", opts)
}

func (c *apiClient) DiscardDeadJob(ctx context.Context, id uuid.UUID, opts *engine.ResolveOpts) (*engine.DeadJob, error) {
	return c.resolve(ctx, id, "discard", opts)
}

func (c *apiClient) bulkDead(ctx context.Context, action string, p engine.ListDeadJobsParams, opts *engine.ResolveOpts, dryRun bool) (engine.BulkResult, error) {
	req := httpapi.BulkDeadJobsRequest{Workflow: p.Workflow, Reason: p.Reason, DryRun: dryRun}
	if opts != nil {
		req.By, req.Note, req.WorkflowVersion = opts.By, opts.Note, opts.Version
	}
	var res engine.BulkResult
	err := c.do(ctx, "POST", "/v1/bulk/"+action+"-dead-jobs", nil, req, nil, &res)
	return res, err
}

func (c *apiClient) ReplayDeadJobs(ctx context.Context, p engine.ResolveDeadJobsParams, opts *engine.ResolveOpts) (engine.BulkResult, error) {
	return c.bulkDead(ctx, "replay", p.Filter, opts, p.DryRun)
}

func (c *apiClient) DiscardDeadJobs(ctx context.Context, p engine.ResolveDeadJobsParams, opts *engine.ResolveOpts) (engine.BulkResult, error) {
	return c.bulkDead(ctx, "discard", p.Filter, opts, p.DryRun)
}

func schedulePath(name string) string { return "/v1/schedules/" + url.PathEscape(name) }

func (c *apiClient) ListQueues(ctx context.Context) ([]engine.QueueInfo, error) {
	var list httpapi.QueueList
	err := c.do(ctx, "GET", "/v1/queues", nil, nil, nil, &list)
	return list.Queues, err
}

func (c *apiClient) PauseQueue(ctx context.Context, name string, opts *engine.PauseOpts) error {
	var o engine.PauseOpts
	if opts != nil {
		o = *opts
	}
	return c.do(ctx, "POST", "/v1/queues/"+url.PathEscape(name)+"/pause", nil, httpapi.PauseQueueRequest{Reason: o.Reason, By: o.By}, nil, nil)
}

func (c *apiClient) ResumeQueue(ctx context.Context, name, by string) error {
	return c.do(ctx, "POST", "/v1/queues/"+url.PathEscape(name)+"/resume", nil, httpapi.ResumeQueueRequest{By: by}, nil, nil)
}

// decodeSchedule reads a schedule as the API writes it (catchup_window
// as a duration string), with its fires when it has them.
func decodeSchedule(raw json.RawMessage) (*engine.Schedule, []engine.ScheduleFire, error) {
	var s engine.Schedule
	var extra struct {
		CatchupWindow string                `json:"catchup_window"`
		Fires         []engine.ScheduleFire `json:"fires"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, nil, fmt.Errorf("decoding a schedule: %w", err)
	}
	if err := json.Unmarshal(raw, &extra); err != nil {
		return nil, nil, fmt.Errorf("decoding a schedule: %w", err)
	}
	if extra.CatchupWindow != "" {
		d, err := time.ParseDuration(extra.CatchupWindow)
		if err != nil {
			return nil, nil, fmt.Errorf("decoding a schedule's catchup_window: %w", err)
		}
		s.CatchupWindow = d
	}
	return &s, extra.Fires, nil
}

func (c *apiClient) ListSchedules(ctx context.Context) ([]engine.Schedule, error) {
	var list struct {
		Schedules []json.RawMessage `json:"schedules"`
	}
	if err := c.do(ctx, "GET", "/v1/schedules", nil, nil, nil, &list); err != nil {
		return nil, err
	}
	out := make([]engine.Schedule, 0, len(list.Schedules))
	for _, raw := range list.Schedules {
		s, _, err := decodeSchedule(raw)
		if err != nil {
			return nil, err
		}
		out = append(out, *s)
	}
	return out, nil
}

func (c *apiClient) getSchedule(ctx context.Context, name string) (*engine.Schedule, []engine.ScheduleFire, error) {
	var raw json.RawMessage
	if err := c.do(ctx, "GET", schedulePath(name), nil, nil, nil, &raw); err != nil {
		return nil, nil, err
	}
	return decodeSchedule(raw)
}

func (c *apiClient) GetSchedule(ctx context.Context, name string) (*engine.Schedule, error) {
	s, _, err := c.getSchedule(ctx, name)
	return s, err
}

// ListScheduleFires reads the fires GET /v1/schedules/{name} lists: the
// latest 50, whatever limit asks beyond that.
func (c *apiClient) ListScheduleFires(ctx context.Context, name string, limit int) ([]engine.ScheduleFire, error) {
	_, fires, err := c.getSchedule(ctx, name)
	if limit > 0 && len(fires) > limit {
		fires = fires[:limit]
	}
	return fires, err
}

// scheduleBody is a schedule's request body (POST /v1/schedules, PUT).
func scheduleBody(spec engine.ScheduleSpec) map[string]any {
	b := map[string]any{"name": spec.Name, "cron": spec.Cron, "time_zone": spec.TimeZone, "workflow": spec.Workflow,
		"overlap": spec.Overlap, "paused": spec.Paused}
	if len(spec.Input) > 0 {
		b["input"] = spec.Input
	}
	if spec.CatchupWindow != 0 {
		b["catchup_window"] = spec.CatchupWindow.String()
	}
	return b
}

func (c *apiClient) saveSchedule(ctx context.Context, method, path string, spec engine.ScheduleSpec) (*engine.Schedule, error) {
	var raw json.RawMessage
	if err := c.do(ctx, method, path, nil, scheduleBody(spec), nil, &raw); err != nil {
		return nil, err
	}
	s, _, err := decodeSchedule(raw)
	return s, err
}

func (c *apiClient) CreateSchedule(ctx context.Context, spec engine.ScheduleSpec) (*engine.Schedule, error) {
	return c.saveSchedule(ctx, "POST", "/v1/schedules", spec)
}

func (c *apiClient) UpdateSchedule(ctx context.Context, spec engine.ScheduleSpec) (*engine.Schedule, error) {
	return c.saveSchedule(ctx, "PUT", schedulePath(spec.Name), spec)
}

func (c *apiClient) PauseSchedule(ctx context.Context, name string) error {
	return c.do(ctx, "POST", schedulePath(name)+"/pause", nil, []byte("{}"), nil, nil)
}

func (c *apiClient) ResumeSchedule(ctx context.Context, name string) error {
	return c.do(ctx, "POST", schedulePath(name)+"/resume", nil, []byte("{}"), nil, nil)
}

func (c *apiClient) DeleteSchedule(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", schedulePath(name), nil, nil, nil, nil)
}

func (c *apiClient) TriggerSchedule(ctx context.Context, name string) (*engine.StartResult, error) {
	var res engine.StartResult
	err := c.do(ctx, "POST", schedulePath(name)+"/trigger", nil, []byte("{}"), nil, &res)
	return &res, err
}
