package httpapi

import (
	"net/http"

	"github.com/pgdurable/pgdurable/engine"
)

// QueueList is GET /v1/queues's answer.
type QueueList struct {
	Queues []engine.QueueInfo `json:"queues"`
}

// PauseQueueRequest is POST /v1/queues/{name}/pause's body: who pauses the
// queue and why (engine.PauseOpts), kept with the pause.
type PauseQueueRequest struct {
	Reason string `json:"reason"`
	By     string `json:"by"`
}

// ResumeQueueRequest is POST /v1/queues/{name}/resume's body.
type ResumeQueueRequest struct {
	By string `json:"by"`
}

// listQueues answers the flow-controlled queues (Engine.ListQueues).
func (a *api) listQueues(w http.ResponseWriter, r *http.Request) {
	if _, ok := queryParams(w, r); !ok {
		return
	}
	qs, err := a.e.ListQueues(r.Context())
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, QueueList{Queues: qs})
}

// pauseQueue pauses a queue (Engine.PauseQueue) and answers it: 200, 404
// for a queue no process defined, 400 for a bad body.
func (a *api) pauseQueue(w http.ResponseWriter, r *http.Request) {
	var req PauseQueueRequest
	if !a.readJSON(w, r, &req, `{"reason": "...", "by": "..."}`) {
		return
	}
	name := r.PathValue("name")
	if err := a.e.PauseQueue(r.Context(), name, &engine.PauseOpts{By: req.By, Reason: req.Reason}); err != nil {
		a.engineError(w, r, err)
		return
	}
	a.writeQueue(w, r, name)
}

// resumeQueue resumes a queue (Engine.ResumeQueue) and answers it.
func (a *api) resumeQueue(w http.ResponseWriter, r *http.Request) {
	var req ResumeQueueRequest
	if !a.readJSON(w, r, &req, `{"by": "..."}`) {
		return
	}
	name := r.PathValue("name")
	if err := a.e.ResumeQueue(r.Context(), name, req.By); err != nil {
		a.engineError(w, r, err)
		return
	}
	a.writeQueue(w, r, name)
}

// writeQueue answers the queue name as ListQueues reads it.
func (a *api) writeQueue(w http.ResponseWriter, r *http.Request, name string) {
	qs, err := a.e.ListQueues(r.Context())
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	for _, q := range qs {
		if q.Name == name {
			writeJSON(w, http.StatusOK, q)
			return
		}
	}
	writeError(w, http.StatusNotFound, "not_found", "queue "+name+" is not defined")
}
