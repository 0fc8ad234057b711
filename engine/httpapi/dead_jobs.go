package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine"
)

// deadJobJSON is a dead job as the API shows it.
type deadJobJSON struct {
	ID              uuid.UUID         `json:"id"`
	RunID           uuid.UUID         `json:"run_id"`
	Workflow        string            `json:"workflow"`
	WorkflowID      string            `json:"workflow_id"`
	WorkflowVersion int               `json:"workflow_version"`
	Input           json.RawMessage   `json:"input"`
	Reason          string            `json:"reason"`
	Step            string            `json:"step,omitempty"`
	Seq             *int              `json:"seq,omitempty"`
	Attempts        int               `json:"attempts"`
	Deliveries      int               `json:"deliveries"`
	FirstFailedAt   time.Time         `json:"first_failed_at"`
	LastFailedAt    time.Time         `json:"last_failed_at"`
	ErrorClass      string            `json:"error_class"`
	ErrorMessage    string            `json:"error_message"`
	Stack           string            `json:"stack,omitempty"`
	ForwardError    *engine.ErrorInfo `json:"forward_error,omitempty"`
	ParkedAt        time.Time         `json:"parked_at"`
	ResolvedAt      *time.Time        `json:"resolved_at,omitempty"`
	Resolution      string            `json:"resolution,omitempty"`
	ResolvedBy      string            `json:"resolved_by,omitempty"`
	Note            string            `json:"note,omitempty"`
}

func toDeadJobJSON(d *engine.DeadJob) deadJobJSON {
	return deadJobJSON{
		ID: d.ID, RunID: d.RunID, Workflow: d.WorkflowName, WorkflowID: d.WorkflowID, WorkflowVersion: d.WorkflowVersion,
		Input: d.Input, Reason: d.Reason, Step: d.StepName, Seq: d.Seq, Attempts: d.Attempts,
		FirstFailedAt: d.FirstFailedAt, LastFailedAt: d.LastFailedAt, ErrorClass: d.ErrorClass,
		ErrorMessage: d.ErrorMessage, Stack: d.Stack, ParkedAt: d.ParkedAt, ResolvedAt: d.ResolvedAt,
		Resolution: d.Resolution, ResolvedBy: d.ResolvedBy, Note: d.Note, Deliveries: d.Deliveries, ForwardError: d.ForwardError,
	}
}

type deadJobList struct {
	DeadJobs   []deadJobJSON `json:"dead_jobs"`
	NextCursor string        `json:"next_cursor,omitempty"`
}

func (a *api) listDeadJobs(w http.ResponseWriter, r *http.Request) {
	limit, ok := queryLimit(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	open := false
	if v := q.Get("open"); v != "" {
		var err error
		if open, err = strconv.ParseBool(v); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("open %q is not true or false", v))
			return
		}
	}
	jobs, next, err := a.e.ListDeadJobs(r.Context(), engine.ListDeadJobsParams{
		Workflow: q.Get("workflow"), Reason: q.Get("reason"), OpenOnly: open,
		Limit: limit, Cursor: q.Get("cursor"),
	})
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	out := deadJobList{DeadJobs: []deadJobJSON{}, NextCursor: next}
	for _, j := range jobs {
		dj := toDeadJobJSON(j)
		dj.Stack = ""
		out.DeadJobs = append(out.DeadJobs, dj)
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) getDeadJob(w http.ResponseWriter, r *http.Request) {
	id, ok := pathUUID(w, r, "id")
	if !ok {
		return
	}
	d, err := a.e.GetDeadJob(r.Context(), id)
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toDeadJobJSON(d))
}

// resolveRequest is the optional body of replay and discard.
type resolveRequest struct {
	By   string `json:"by"`
	Note string `json:"note"`
}

func (a *api) resolveDeadJob(resolve func(context.Context, uuid.UUID, *engine.ResolveOpts) (*engine.DeadJob, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, ok := pathUUID(w, r, "id")
		if !ok {
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			a.engineError(w, r, err)
			return
		}
		var req resolveRequest
		if len(bytes.TrimSpace(body)) > 0 {
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&req); err != nil {
				writeError(w, http.StatusBadRequest, "invalid_json", `body must be {"by": string, "note": string} or empty: `+err.Error())
				return
			}
		}
		d, err := resolve(r.Context(), id, &engine.ResolveOpts{By: req.By, Note: req.Note})
		if err != nil {
			a.engineError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, toDeadJobJSON(d))
	}
}
