package webui

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/httpapi"
)

// pageNames are the templates under assets/, each rendered inside layout.
var pageNames = []string{"overview", "runs", "run", "dead_jobs", "dead_job", "schedules", "schedule", "workflows", "queues", "login", "error", "confirm"}

func parsePages() map[string]*template.Template {
	funcs := template.FuncMap{
		"when":     when,
		"ago":      ago,
		"dur":      dur,
		"pretty":   pretty,
		"preview":  preview,
		"iso":      iso,
		"inZone":   inZone,
		"short":    short,
		"deref":    func(p *int) int { return *p },
		"statuses": func() []engine.RunStatus { return runStatuses },
		"reasons":  func() []engine.DeadReason { return deadReasons },
		"query":    query,
		"tags":     tagList,
		"clip":     clip,
	}
	layout := template.Must(template.New("layout").Funcs(funcs).ParseFS(assets, "assets/layout.html"))
	out := make(map[string]*template.Template, len(pageNames))
	for _, n := range pageNames {
		t := template.Must(template.Must(layout.Clone()).ParseFS(assets, "assets/"+n+".html"))
		out[n] = t
	}
	return out
}

var (
	runStatuses = engine.RunStatuses()
	deadReasons = engine.DeadReasons()
)

// when formats a time (a time.Time or *time.Time; nil or zero: "—") in
// UTC to the second.
func when(v any) string {
	var t time.Time
	switch x := v.(type) {
	case time.Time:
		t = x
	case *time.Time:
		if x != nil {
			t = *x
		}
	}
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// iso is t for a datetime attribute (RFC 3339, UTC).
func iso(v any) string {
	switch x := v.(type) {
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case *time.Time:
		if x != nil {
			return x.UTC().Format(time.RFC3339Nano)
		}
	}
	return ""
}

// inZone is t in the IANA zone tz, for a schedule's own clock.
func inZone(t time.Time, tz string) string {
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return ""
	}
	return t.In(loc).Format("2006-01-02 15:04 MST")
}

// ago is how long before now t was, rounded for a person.
func ago(v any) string {
	var t time.Time
	switch x := v.(type) {
	case time.Time:
		t = x
	case *time.Time:
		if x == nil {
			return ""
		}
		t = *x
	}
	d := time.Since(t)
	if d < 0 {
		return "in " + human(-d)
	}
	return human(d) + " ago"
}

func human(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%d min", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%.1f h", d.Hours())
	}
	return fmt.Sprintf("%d days", int(d.Hours()/24))
}

// dur is the time from a to b (b nil: "—").
func dur(a time.Time, b *time.Time) string {
	if b == nil {
		return "—"
	}
	return human(b.Sub(a))
}

// pretty indents a JSON value for reading (at most 64 KiB of it).
func pretty(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return string(raw)
	}
	return cut(buf.String(), 64<<10)
}

// cut keeps at most n bytes of s, on a character boundary, saying so.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "\n… (cut here; the API returns all of it)"
}

// clip is s on one line, cut to about n bytes with an ellipsis, for a
// table cell (the page it links to has all of it).
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// preview is a payload on one line, cut at 2 KiB.
func preview(raw json.RawMessage) string { return cut(string(raw), 2<<10) }

// short is an ID's last 8 characters, for tables: a UUID v7 begins with
// its time, so IDs made together share their first characters.
func short(v any) string {
	s := fmt.Sprint(v)
	if p, ok := v.(*uuid.UUID); ok {
		if p == nil {
			return ""
		}
		s = p.String()
	}
	if len(s) > 8 {
		return "…" + s[len(s)-8:]
	}
	return s
}

// query is a query string of key/value pairs, the empty ones left out.
func query(kv ...string) template.URL {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	return template.URL(q.Encode())
}

func (u *ui) overview(w http.ResponseWriter, r *http.Request) {
	o, err := u.e.Overview(r.Context())
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	wfs, err := u.e.ListWorkflows(r.Context())
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	queues, err := u.e.ListQueues(r.Context())
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	u.render(w, r, http.StatusOK, "overview", &page{Title: "Overview", Nav: "overview", Data: map[string]any{
		"O": o, "Workflows": len(wfs), "Open": openCounts(o.OpenRuns), "Queues": queues,
	}})
}

type statusCount struct {
	Status engine.RunStatus
	N      int64
}

func openCounts(m map[engine.RunStatus]int64) []statusCount {
	var out []statusCount
	for _, s := range runStatuses {
		if s.Open() {
			out = append(out, statusCount{s, m[s]})
		}
	}
	return out
}

// runFilter is the runs page's filter, as its form and query string hold it.
// TopLevel is "true" to leave out child runs (a checkbox), else "".
// Patched and Unpatched are change IDs (engine.Patched);
// Version a workflow version, "" for any.
type runFilter struct {
	Workflow, Version, Status, Prefix, CreatedAfter, CreatedBefore, Tags, TopLevel, Patched, Unpatched, Cursor string
}

func readRunFilter(v url.Values) runFilter {
	f := runFilter{Workflow: v.Get("workflow"), Version: strings.TrimSpace(v.Get("workflow_version")), Status: v.Get("status"), Prefix: v.Get("workflow_id_prefix"),
		CreatedAfter: v.Get("created_after"), CreatedBefore: v.Get("created_before"), Tags: v.Get("tags"), Cursor: v.Get("cursor"),
		Patched: strings.TrimSpace(v.Get("patched")), Unpatched: strings.TrimSpace(v.Get("unpatched"))}
	if top, _ := strconv.ParseBool(v.Get("top_level")); top {
		f.TopLevel = "true"
	}
	return f
}

// params turns the filter into ListRunsParams: times are RFC 3339, a
// datetime-local field's value (UTC), or a duration ago ("1h").
func (f runFilter) params() (engine.ListRunsParams, error) {
	p := engine.ListRunsParams{Workflow: f.Workflow, Status: engine.RunStatus(f.Status), WorkflowIDPrefix: f.Prefix, Cursor: f.Cursor, Limit: 50,
		TopLevel: f.TopLevel != "", Patched: f.Patched, Unpatched: f.Unpatched}
	var err error
	if f.Version != "" {
		if p.Version, err = strconv.Atoi(f.Version); err != nil || p.Version < 1 {
			return p, badForm("workflow version: %q is not a version (1 or more)", f.Version)
		}
	}
	if p.CreatedAfter, err = parseWhen("created after", f.CreatedAfter); err != nil {
		return p, err
	}
	if p.CreatedBefore, err = parseWhen("created before", f.CreatedBefore); err != nil {
		return p, err
	}
	if p.Tags, err = httpapi.ParseTags(splitTags(f.Tags)); err != nil {
		return p, err
	}
	return p, nil
}

func (f runFilter) query(cursor string) template.URL {
	return query("workflow", f.Workflow, "workflow_version", f.Version, "status", f.Status, "workflow_id_prefix", f.Prefix, "created_after", f.CreatedAfter,
		"created_before", f.CreatedBefore, "tags", f.Tags, "top_level", f.TopLevel, "patched", f.Patched, "unpatched", f.Unpatched, "cursor", cursor)
}

func parseWhen(field, s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return time.Now().Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, badForm("%s: %q is not a time (2026-12-01T09:30, RFC 3339) or a duration ago (90m)", field, s)
}

func (u *ui) runs(w http.ResponseWriter, r *http.Request) {
	f := readRunFilter(r.URL.Query())
	p, err := f.params()
	var runs []*engine.Run
	var next string
	if err == nil {
		runs, next, err = u.e.ListRuns(r.Context(), p)
	}
	if status, _ := u.opts.APIError(err); err != nil && (status < 500 || errors.Is(err, errBadForm)) {
		// A bad filter: say why above the form, which keeps what was typed.
		u.render(w, r, http.StatusBadRequest, "runs", &page{Title: "Runs", Nav: "runs", Error: err.Error(),
			Data: map[string]any{"F": f}})
		return
	} else if err != nil {
		u.engineError(w, r, err)
		return
	}
	o, err := u.e.Overview(r.Context())
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	data := map[string]any{"Runs": runs, "F": f, "Open": openCounts(o.OpenRuns)}
	if next != "" {
		data["Next"] = f.query(next)
	}
	if f.Cursor != "" {
		data["First"] = f.query("")
	}
	u.render(w, r, http.StatusOK, "runs", &page{Title: "Runs", Nav: "runs", Data: data})
}

// cancelMatching cancels the runs a filter matches: first a dry run that
// counts them and asks to confirm, then the cancellation.
func (u *ui) cancelMatching(w http.ResponseWriter, r *http.Request) {
	f := readRunFilter(r.PostForm)
	f.Cursor = ""
	p, err := f.params()
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	p.Limit, p.Cursor = 0, ""
	confirm := r.PostForm.Get("confirm") == "yes"
	if !confirm {
		// The confirmation acts on what this count saw: its times become
		// absolute, and no run created after the count is cancelled
		// (found by an attack pass: it cancelled runs started meanwhile).
		if now := time.Now(); p.CreatedBefore.IsZero() || p.CreatedBefore.After(now) {
			p.CreatedBefore = now
		}
		f.CreatedBefore = p.CreatedBefore.UTC().Format(time.RFC3339Nano)
		if !p.CreatedAfter.IsZero() {
			f.CreatedAfter = p.CreatedAfter.UTC().Format(time.RFC3339Nano)
		}
	}
	res, err := u.e.CancelRuns(r.Context(), engine.CancelRunsParams{Filter: p, DryRun: !confirm})
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	fields := [][2]string{{"workflow", f.Workflow}, {"workflow_version", f.Version}, {"status", f.Status}, {"workflow_id_prefix", f.Prefix},
		{"created_after", f.CreatedAfter}, {"created_before", f.CreatedBefore}, {"tags", f.Tags}, {"top_level", f.TopLevel},
		{"patched", f.Patched}, {"unpatched", f.Unpatched}}
	u.render(w, r, http.StatusOK, "confirm", &page{Title: "Cancel matching runs", Nav: "runs", Data: map[string]any{
		"Verb": "Cancel", "What": "runs", "Result": res, "Confirmed": confirm, "Action": "/ui/runs/cancel-matching",
		"Fields": fields, "Back": "/ui/runs?" + string(f.query("")),
	}})
}

// runView is a run with its steps laid out as a waterfall.
type runView struct {
	*engine.Run
	Bars      []bar
	Window    string // the waterfall's span, for its caption
	CanCancel bool
	CanStart  bool
	// InFlight, for a terminated run, are the steps it was terminated in
	// the middle of (engine.Run.UnsettledSteps): each may have taken
	// effect with nothing to undo it, and the page says so.
	InFlight []engine.StepInfo
}

// bar places a step on the waterfall: X and W in per mille of the window.
// History is its attempts, for a step that had a failed one.
type bar struct {
	engine.StepInfo
	X, W     int
	Duration string
	History  []attemptLine
}

// attemptLine is one line of a step's attempt history: a failed attempt
// as recorded, a dead job's replay, or the step's last attempt as its
// record says (completed, in progress, cancelled).
type attemptLine struct {
	Attempt int    // 0: a replay
	Outcome string // retrying, failed, parked, replayed, completed, in progress, cancelled
	Class   string
	Message string
	At      *time.Time // nil: not recorded (an attempt in progress)
	Lost    bool       // the attempt died with its worker (class worker_lost)
}

// history is s's attempts: its recorded failures, oldest first, then the
// attempt its record holds now when that is not one of them. nil for a
// step with no recorded failure: its one attempt is the step's row.
func history(s engine.StepInfo) []attemptLine {
	if len(s.FailedAttempts) == 0 {
		return nil
	}
	var out []attemptLine
	for _, f := range s.FailedAttempts {
		at := f.At
		if f.Replayed {
			out = append(out, attemptLine{Outcome: "replayed", Message: "a dead job's replay: the attempts count from 1 again", At: &at})
			continue
		}
		out = append(out, attemptLine{Attempt: f.Attempt, Outcome: string(f.Status), Class: string(f.Class), Message: f.Message, At: &at,
			Lost: f.Class == engine.ClassWorkerLost})
	}
	switch s.Status {
	case engine.StepCompleted:
		out = append(out, attemptLine{Attempt: s.Attempts, Outcome: "completed", At: s.CompletedAt})
	case engine.StepStarted:
		if last := s.FailedAttempts[len(s.FailedAttempts)-1]; last.Replayed || last.Attempt < s.Attempts {
			out = append(out, attemptLine{Attempt: s.Attempts, Outcome: "in progress"})
		}
	case engine.StepCancelled:
		out = append(out, attemptLine{Attempt: s.Attempts, Outcome: "cancelled", At: s.CompletedAt})
	}
	return out
}

func newRunView(run *engine.Run) *runView {
	v := &runView{Run: run}
	open := run.Status.Open()
	v.CanCancel = open && run.CancelRequestedAt == nil && run.Status != engine.StatusDead
	v.CanStart = run.Status == engine.StatusWaiting && run.StartedAt == nil
	if run.Status == engine.StatusTerminated {
		v.InFlight = run.UnsettledSteps()
	}
	if len(run.Steps) == 0 {
		return v
	}
	start, end := run.Steps[0].StartedAt, run.Steps[0].StartedAt
	// A step still open ends now, or, in a run that ended (a parked step
	// of a dead run), when the run did.
	now := time.Now()
	if run.CompletedAt != nil {
		now = *run.CompletedAt
	}
	stepEnd := func(s engine.StepInfo) time.Time {
		if s.CompletedAt != nil {
			return *s.CompletedAt
		}
		if now.Before(s.StartedAt) {
			return s.StartedAt
		}
		return now
	}
	for _, s := range run.Steps {
		if s.StartedAt.Before(start) {
			start = s.StartedAt
		}
		if e := stepEnd(s); e.After(end) {
			end = e
		}
	}
	span := end.Sub(start)
	if span <= 0 {
		span = time.Millisecond
	}
	v.Window = human(span)
	for _, s := range run.Steps {
		e := stepEnd(s)
		x := int(s.StartedAt.Sub(start) * 1000 / span)
		wd := max(int(e.Sub(s.StartedAt)*1000/span), 4) // a step too short to see still shows
		x = min(x, 996)
		wd = min(wd, 1000-x)
		v.Bars = append(v.Bars, bar{StepInfo: s, X: x, W: wd, Duration: dur(s.StartedAt, s.CompletedAt), History: history(s)})
	}
	return v
}

func (u *ui) run(w http.ResponseWriter, r *http.Request) {
	id, err := u.e.FindRun(r.Context(), r.PathValue("id"))
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	run, err := u.e.GetRun(r.Context(), id)
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	var dead []*engine.DeadJob
	if run.Status == engine.StatusDead {
		if dead, _, err = u.e.ListDeadJobs(r.Context(), engine.ListDeadJobsParams{RunID: id, OpenOnly: true, Limit: 1}); err != nil {
			u.engineError(w, r, err)
			return
		}
	}
	data := map[string]any{"R": newRunView(run)}
	if len(dead) > 0 {
		data["Dead"] = dead[0]
	}
	u.render(w, r, http.StatusOK, "run", &page{Title: "Run " + short(run.RunID), Nav: "runs", Data: data})
}

func (u *ui) runAction(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id, err := u.e.FindRun(ctx, r.PathValue("id"))
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	var done string
	switch r.PathValue("action") {
	case "cancel":
		err, done = u.e.Cancel(ctx, id), "cancelled"
	case "terminate":
		err, done = u.e.Terminate(ctx, id, &engine.TerminateOpts{Reason: r.PostForm.Get("reason"), By: by(r)}), "terminated"
	case "start-now":
		err, done = u.e.StartNow(ctx, id), "started"
	case "signal":
		payload := strings.TrimSpace(r.PostForm.Get("payload"))
		if payload == "" {
			payload = "null"
		}
		if !json.Valid([]byte(payload)) {
			err = badForm("the signal's payload is not JSON: write a JSON value (\"yes\", 42, {\"k\": 1}), or leave it empty for null")
			break
		}
		err, done = u.e.SignalJSON(ctx, id.String(), r.PostForm.Get("name"), []byte(payload), nil), "signalled"
	default:
		u.fail(w, r, http.StatusNotFound, "There is no action "+strconv.Quote(r.PathValue("action"))+" on runs.")
		return
	}
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	http.Redirect(w, r, "/ui/runs/"+id.String()+"?done="+done, http.StatusSeeOther)
}

// by is who acts, for the audit trail: the form's "by", else "web UI".
func by(r *http.Request) string {
	if b := strings.TrimSpace(r.PostForm.Get("by")); b != "" {
		return b
	}
	return "web UI"
}

func (u *ui) deadJobs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := engine.ListDeadJobsParams{Workflow: q.Get("workflow"), Reason: engine.DeadReason(q.Get("reason")),
		OpenOnly: q.Get("all") == "", Cursor: q.Get("cursor"), Limit: 50}
	jobs, next, err := u.e.ListDeadJobs(r.Context(), p)
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	all := ""
	if !p.OpenOnly {
		all = "1"
	}
	data := map[string]any{"Jobs": jobs, "Workflow": p.Workflow, "Reason": string(p.Reason), "All": all}
	if next != "" {
		data["Next"] = query("workflow", p.Workflow, "reason", string(p.Reason), "all", all, "cursor", next)
	}
	u.render(w, r, http.StatusOK, "dead_jobs", &page{Title: "Dead jobs", Nav: "dead", Data: data})
}

func (u *ui) deadJob(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		u.fail(w, r, http.StatusNotFound, "There is no dead job "+strconv.Quote(r.PathValue("id"))+".")
		return
	}
	j, err := u.e.GetDeadJob(r.Context(), id)
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	u.render(w, r, http.StatusOK, "dead_job", &page{Title: "Dead job " + short(j.ID), Nav: "dead", Data: j})
}

func (u *ui) deadJobAction(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		u.fail(w, r, http.StatusNotFound, "There is no dead job "+strconv.Quote(r.PathValue("id"))+".")
		return
	}
	opts := &engine.ResolveOpts{By: by(r), Note: r.PostForm.Get("note")}
	if v := strings.TrimSpace(r.PostForm.Get("workflow_version")); v != "" && r.PathValue("action") == "replay" {
		if opts.Version, err = strconv.Atoi(v); err != nil || opts.Version < 1 {
			u.engineError(w, r, badForm("onto version: %q is not a workflow version (1 or more)", v))
			return
		}
	}
	var j *engine.DeadJob
	switch r.PathValue("action") {
	case "replay":
		j, err = u.e.ReplayDeadJob(r.Context(), id, opts)
	case "discard":
		j, err = u.e.DiscardDeadJob(r.Context(), id, opts)
	default:
		u.fail(w, r, http.StatusNotFound, "There is no action "+strconv.Quote(r.PathValue("action"))+" on dead jobs.")
		return
	}
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	if r.PathValue("action") == "replay" {
		http.Redirect(w, r, "/ui/runs/"+j.RunID.String()+"?done=replayed", http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, "/ui/dead-jobs/"+id.String()+"?done=discarded", http.StatusSeeOther)
}

// deadJobsBulk replays or discards the dead jobs ticked on the list
// (ids), or, with none ticked, those the list's filter matches after a
// dry run that counts them.
func (u *ui) deadJobsBulk(w http.ResponseWriter, r *http.Request) {
	f := r.PostForm
	action := f.Get("action")
	if action != "replay" && action != "discard" {
		u.engineError(w, r, badForm("action must be replay or discard, not %q", action))
		return
	}
	opts := &engine.ResolveOpts{By: by(r), Note: f.Get("note")}
	if ids := f["id"]; len(ids) > 0 {
		if len(ids) > 1000 {
			u.engineError(w, r, badForm("%d dead jobs ticked; at most 1,000 at once (use the filter instead)", len(ids)))
			return
		}
		slices.Sort(ids)
		ids = slices.Compact(ids)
		res := engine.BulkResult{Matched: len(ids)}
		for _, s := range ids {
			id, err := uuid.Parse(s)
			if err != nil {
				u.engineError(w, r, badForm("%q is not a dead job's ID", s))
				return
			}
			// A job resolved since the list was shown (another operator, a
			// stale page) is skipped, not counted as done: replaying it
			// again would succeed and change nothing.
			switch j, err := u.e.GetDeadJob(r.Context(), id); {
			case errors.Is(err, engine.ErrNotFound):
				res.Skipped++
				continue
			case err != nil:
				u.engineError(w, r, err)
				return
			case j.ResolvedAt != nil:
				res.Skipped++
				continue
			}
			if action == "replay" {
				_, err = u.e.ReplayDeadJob(r.Context(), id, opts)
			} else {
				_, err = u.e.DiscardDeadJob(r.Context(), id, opts)
			}
			switch {
			case err == nil:
				res.Done++
			case errors.Is(err, engine.ErrDeadJobResolved), errors.Is(err, engine.ErrNotFound):
				res.Skipped++
			default:
				u.engineError(w, r, err)
				return
			}
		}
		u.render(w, r, http.StatusOK, "confirm", &page{Title: bulkTitle(action), Nav: "dead", Data: map[string]any{
			"Verb": verb(action), "What": "dead jobs", "Result": res, "Confirmed": true, "Back": "/ui/dead-jobs",
		}})
		return
	}
	p := engine.ListDeadJobsParams{Workflow: f.Get("workflow"), Reason: engine.DeadReason(f.Get("reason"))}
	confirm := f.Get("confirm") == "yes"
	if confirm {
		t, err := time.Parse(time.RFC3339Nano, f.Get("parked_before"))
		if err != nil {
			u.engineError(w, r, badForm("the confirmation has no count time (parked_before): count again"))
			return
		}
		p.ParkedBefore = t
	} else {
		p.ParkedBefore = time.Now() // the confirmation acts on what this count saw
	}
	var res engine.BulkResult
	var err error
	if action == "replay" {
		res, err = u.e.ReplayDeadJobs(r.Context(), engine.ResolveDeadJobsParams{Filter: p, DryRun: !confirm}, opts)
	} else {
		res, err = u.e.DiscardDeadJobs(r.Context(), engine.ResolveDeadJobsParams{Filter: p, DryRun: !confirm}, opts)
	}
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	u.render(w, r, http.StatusOK, "confirm", &page{Title: bulkTitle(action), Nav: "dead", Data: map[string]any{
		"Verb": verb(action), "What": "open dead jobs", "Result": res, "Confirmed": confirm, "Action": "/ui/dead-jobs/bulk",
		"Fields": [][2]string{{"action", action}, {"workflow", p.Workflow}, {"reason", string(p.Reason)}, {"note", opts.Note}, {"by", f.Get("by")},
			{"parked_before", p.ParkedBefore.UTC().Format(time.RFC3339Nano)}},
		"Back": "/ui/dead-jobs?" + string(query("workflow", p.Workflow, "reason", string(p.Reason))),
	}})
}

func verb(action string) string {
	if action == "replay" {
		return "Replay"
	}
	return "Discard"
}

func bulkTitle(action string) string { return verb(action) + " dead jobs" }

func (u *ui) schedules(w http.ResponseWriter, r *http.Request) {
	list, err := u.e.ListSchedules(r.Context())
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	u.render(w, r, http.StatusOK, "schedules", &page{Title: "Schedules", Nav: "schedules", Data: list})
}

// scheduleView is a schedule with its next fire times and its history.
type scheduleView struct {
	*engine.Schedule
	Next  []time.Time
	Fires []engine.ScheduleFire
}

func (u *ui) schedule(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	s, err := u.e.GetSchedule(r.Context(), name)
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	fires, err := u.e.ListScheduleFires(r.Context(), name, 50)
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	v := &scheduleView{Schedule: s, Fires: fires}
	if !s.Paused {
		v.Next, _ = engine.NextFireTimes(s.Cron, s.TimeZone, s.NextFireAt, 5)
	}
	u.render(w, r, http.StatusOK, "schedule", &page{Title: "Schedule " + s.Name, Nav: "schedules", Data: v})
}

func (u *ui) scheduleAction(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var err error
	done := ""
	switch r.PathValue("action") {
	case "pause":
		err, done = u.e.PauseSchedule(r.Context(), name), "paused"
	case "resume":
		err, done = u.e.ResumeSchedule(r.Context(), name), "resumed"
	case "trigger":
		_, err = u.e.TriggerSchedule(r.Context(), name)
		done = "triggered"
	default:
		u.fail(w, r, http.StatusNotFound, "There is no action "+strconv.Quote(r.PathValue("action"))+" on schedules.")
		return
	}
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	http.Redirect(w, r, "/ui/schedules/"+url.PathEscape(name)+"?done="+done, http.StatusSeeOther)
}

func (u *ui) queues(w http.ResponseWriter, r *http.Request) {
	list, err := u.e.ListQueues(r.Context())
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	u.render(w, r, http.StatusOK, "queues", &page{Title: "Queues", Nav: "queues", Data: list})
}

// queueAction pauses or resumes a queue, recording who ("by", default
// "web UI") and, for a pause, why.
func (u *ui) queueAction(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var err error
	done := ""
	switch r.PathValue("action") {
	case "pause":
		err, done = u.e.PauseQueue(r.Context(), name, &engine.PauseOpts{By: by(r), Reason: strings.TrimSpace(r.PostForm.Get("reason"))}), "queue-paused"
	case "resume":
		err, done = u.e.ResumeQueue(r.Context(), name, by(r)), "queue-resumed"
	default:
		u.fail(w, r, http.StatusNotFound, "There is no action "+strconv.Quote(r.PathValue("action"))+" on queues.")
		return
	}
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	http.Redirect(w, r, "/ui/queues?done="+done, http.StatusSeeOther)
}

func (u *ui) workflows(w http.ResponseWriter, r *http.Request) {
	list, err := u.e.ListWorkflows(r.Context())
	if err != nil {
		u.engineError(w, r, err)
		return
	}
	u.render(w, r, http.StatusOK, "workflows", &page{Title: "Workflows", Nav: "workflows", Data: list})
}

// tagStart finds where a tag filter begins after white space: a key and
// its = or :. A value may hold spaces ("city=New York").
var tagStart = regexp.MustCompile(`\s+[A-Za-z0-9_.-]{1,64}[=:]`)

// splitTags splits the UI's tags field, "k=v k2=v two", into filters.
func splitTags(s string) []string {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil
	}
	var out []string
	for {
		loc := tagStart.FindStringIndex(s) // never at 0: s is trimmed
		if loc == nil {
			return append(out, s)
		}
		out = append(out, s[:loc[0]])
		s = strings.TrimSpace(s[loc[0]:])
	}
}

// tagList is a run's tags as "key=value" strings, by key.
func tagList(tags map[string]string) []string {
	out := make([]string, 0, len(tags))
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		out = append(out, k+"="+tags[k])
	}
	return out
}
