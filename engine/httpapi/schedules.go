package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// scheduleRequest is the body of POST /v1/schedules and PUT
// /v1/schedules/{name}; catchup_window is a Go duration ("1h", "10m").
type scheduleRequest struct {
	Name          string          `json:"name"`
	Cron          string          `json:"cron"`
	TimeZone      string          `json:"time_zone"`
	Workflow      string          `json:"workflow"`
	Input         json.RawMessage `json:"input"`
	Overlap       string          `json:"overlap"`
	CatchupWindow string          `json:"catchup_window"`
	Paused        bool            `json:"paused"`
}

// readSchedule decodes a schedule request, writing a 400 on failure.
func (a *api) readSchedule(w http.ResponseWriter, r *http.Request) (*engine.ScheduleSpec, bool) {
	var req scheduleRequest
	if !a.readJSON(w, r, &req, "one JSON object: name, cron, time_zone, workflow, input, overlap, catchup_window, paused") {
		return nil, false
	}
	spec := &engine.ScheduleSpec{Name: req.Name, Cron: req.Cron, TimeZone: req.TimeZone, Workflow: req.Workflow,
		Input: req.Input, Overlap: req.Overlap, Paused: req.Paused}
	if req.CatchupWindow != "" {
		d, err := time.ParseDuration(req.CatchupWindow)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("catchup_window %q is not a duration such as 1h or 10m", req.CatchupWindow))
			return nil, false
		}
		spec.CatchupWindow = d
	}
	return spec, true
}

func (a *api) createSchedule(w http.ResponseWriter, r *http.Request) {
	spec, ok := a.readSchedule(w, r)
	if !ok {
		return
	}
	s, err := a.e.CreateSchedule(r.Context(), *spec)
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s)
}

func (a *api) updateSchedule(w http.ResponseWriter, r *http.Request) {
	spec, ok := a.readSchedule(w, r)
	if !ok {
		return
	}
	if spec.Name != "" && spec.Name != r.PathValue("name") {
		writeError(w, http.StatusBadRequest, "invalid_parameter", "the body's name differs from the path's; schedules cannot be renamed")
		return
	}
	spec.Name = r.PathValue("name")
	s, err := a.e.UpdateSchedule(r.Context(), *spec)
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s)
}

func (a *api) listSchedules(w http.ResponseWriter, r *http.Request) {
	list, err := a.e.ListSchedules(r.Context())
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	if list == nil {
		list = []engine.Schedule{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"schedules": list})
}

// getSchedule answers the schedule with its latest 50 fires.
func (a *api) getSchedule(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	s, err := a.e.GetSchedule(r.Context(), name)
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	fires, err := a.e.ListScheduleFires(r.Context(), name, 50)
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ScheduleWithFires{Schedule: s, Fires: fires})
}

func (a *api) scheduleAction(act func(*api, *http.Request, string) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		if err := act(a, r, name); err != nil {
			a.engineError(w, r, err)
			return
		}
		if r.Method == http.MethodDelete {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		s, err := a.e.GetSchedule(r.Context(), name)
		if err != nil {
			a.engineError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, s)
	}
}

// triggerSchedule fires a schedule now and answers the run it started.
func (a *api) triggerSchedule(w http.ResponseWriter, r *http.Request) {
	res, err := a.e.TriggerSchedule(r.Context(), r.PathValue("name"))
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, res)
}

func pauseSchedule(a *api, r *http.Request, name string) error {
	return a.e.PauseSchedule(r.Context(), name)
}
func resumeSchedule(a *api, r *http.Request, name string) error {
	return a.e.ResumeSchedule(r.Context(), name)
}
func deleteSchedule(a *api, r *http.Request, name string) error {
	return a.e.DeleteSchedule(r.Context(), name)
}
