package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine"
)

func (a *api) listDeadJobs(w http.ResponseWriter, r *http.Request) {
	q, ok := queryParams(w, r, "workflow", "reason", "open", "limit", "cursor", "run_id")
	if !ok {
		return
	}
	var runID uuid.UUID
	if v := q.Get("run_id"); v != "" {
		var err error
		if runID, err = uuid.Parse(v); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("run_id %q is not a run ID", truncate(v, 64)))
			return
		}
	}
	limit, ok := queryLimit(w, r)
	if !ok {
		return
	}
	open := false
	if v := q.Get("open"); v != "" {
		var err error
		if open, err = strconv.ParseBool(v); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("open %q is not true or false", v))
			return
		}
	}
	jobs, next, err := a.e.ListDeadJobs(r.Context(), engine.ListDeadJobsParams{
		Workflow: q.Get("workflow"), Reason: engine.DeadReason(q.Get("reason")), OpenOnly: open, RunID: runID,
		Limit: limit, Cursor: q.Get("cursor"),
	})
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, NewDeadJobList(jobs, next))
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
	writeJSON(w, http.StatusOK, d)
}

// resolveRequest is the optional body of replay and discard.
type resolveRequest struct {
	By   string `json:"by"`
	Note string `json:"note"`
	// WorkflowVersion, for a replay, moves the run to that version first
	// (engine.ResolveOpts.Version).
	WorkflowVersion int `json:"workflow_version"`
}

func (a *api) resolveDeadJob(resolve func(context.Context, uuid.UUID, *engine.ResolveOpts) (*engine.DeadJob, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, ok := pathUUID(w, r, "id")
		if !ok {
			return
		}
		body, ok := a.readBody(w, r)
		if !ok {
			return
		}
		var req resolveRequest
		if len(bytes.TrimSpace(body)) > 0 {
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&req); err != nil {
				writeError(w, http.StatusBadRequest, "invalid_json", `body must be {"by": string, "note": string, "workflow_version": integer (a replay's)} or empty: `+err.Error())
				return
			}
		}
		d, err := resolve(r.Context(), id, &engine.ResolveOpts{By: req.By, Note: req.Note, Version: req.WorkflowVersion})
		if err != nil {
			a.engineError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, d)
	}
}
