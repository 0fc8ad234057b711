// Package httpapi serves the engine's HTTP API: start runs (now, later,
// or with a signal), read, signal, cancel and terminate them, and inspect,
// replay and discard dead jobs; manage schedules. Outside tools depend on
// its routes, fields and status codes; keep them stable.
//
// Routes (JSON in and out; errors are {"error": {"code", "message"}}; a
// body that is not valid JSON is 400 invalid_json, saying at which byte
// offset it breaks):
//
//	POST /v1/workflows/{name}/runs        {"id": "...", "input": {...}} (optional "start_at": RFC 3339 or "delay": "90s",
//	                                      "run_timeout": "5m", "tags": {"k": "v"}) → 201 new, 200 same ID + same input,
//	                                      409 same ID + other input, 404 unknown workflow, 400 bad input
//	POST /v1/workflows/{name}/signal-with-start
//	                                      {"id": "...", "input": {...}, "signal": "name", "payload": {...}} (and a start's
//	                                      options) → the run with that workflow ID gets the signal, started first if there
//	                                      is none: 201 started, 200 existed; 404 unknown workflow, 409 run_closed or
//	                                      signal_key_conflict, 400 no id, bad input, name, key or payload; the optional
//	                                      Idempotency-Key header is the signal's key, as for signals
//	GET  /v1/runs/{run_id}                the run with steps[], signals[] and children[]; {run_id} may be a workflow ID;
//	                                      ?steps_from=N&signals=false&payloads=false trims it for a follower
//	                                      (engine.GetRunOpts)
//	GET  /v1/runs?workflow=&status=&workflow_id_prefix=&created_after=&created_before=&finished_after=&finished_before=
//	              &tag=key:value (repeatable: all must match)&top_level=&patched=&unpatched=&workflow_version=&limit=&cursor=
//	POST /v1/runs/{run_id}/signals/{name} body = payload (one JSON value) → 202 buffered, 404, 409 run finished, 400;
//	                                      {run_id} may also be a workflow ID. Optional header Idempotency-Key (1 to 200
//	                                      bytes, given once): the same key, name and payload again is accepted and not
//	                                      stored twice; the key with another signal is 409 signal_key_conflict
//	POST /v1/runs/{run_id}/cancel         202 accepted, 404, 409 already finished; {run_id} may be a workflow ID
//	POST /v1/runs/{run_id}/start-now      a delayed run (start_at, delay) starts at once → 200 the run (also when it
//	                                      already had), 404, 409 run_closed, 400 a run that has started; {run_id} may
//	                                      be a workflow ID
//	POST /v1/runs/{run_id}/terminate      {"reason": "...", "by": "..."} → 200 the run, ended at once without
//	                                      compensations (an activity in flight is not undone: its step stays
//	                                      started, see engine.Run.UnsettledSteps); 404, 409 already finished,
//	                                      400 no reason, or a reason or by with a control or bidi character
//	GET  /v1/workflows                    {"workflows": [...]}: what live engine processes register, where
//	POST /v1/runs/prune                   {"older_than": "720h", "dry_run": true} → 200 the rows deleted (or counted)
//	POST /v1/bulk/cancel-runs             {"workflow", "status", "workflow_id_prefix", "created_after", "created_before",
//	                                      "tags", "dry_run"} → 200 {"matched", "done", "skipped", "more", "dry_run"}
//	POST /v1/bulk/replay-dead-jobs, POST /v1/bulk/discard-dead-jobs
//	                                      {"workflow", "reason", "by", "note", "dry_run"} → 200 the same
//	GET  /v1/schedules                    {"schedules": [...]}
//	POST /v1/schedules                    {"name", "cron", "time_zone", "workflow", "input", "overlap",
//	                                      "catchup_window": "1h", "paused"} → 201, 409 schedule_exists, 400, 404 unknown workflow
//	GET  /v1/schedules/{name}             the schedule with its latest 50 fires
//	PUT  /v1/schedules/{name}             the same body → 200, 404
//	DELETE /v1/schedules/{name}           → 204, 404
//	POST /v1/schedules/{name}/pause, POST /v1/schedules/{name}/resume → 200, 404
//	POST /v1/schedules/{name}/trigger     fire it now (outside its cron, even paused) → 201 {"run_id", "workflow_id", ...},
//	                                      a new run at every call (workflow ID schedule:<name>:trigger:<UUID v7>)
//	GET  /v1/dead-jobs?workflow=&reason=&open=&run_id=&limit=&cursor=
//	GET  /v1/dead-jobs/{id}
//	POST /v1/dead-jobs/{id}/replay        {"by": "...", "note": "...", "workflow_version": 2} (optional; the version moves the
//	                                      run to that version of its workflow first) → 200 the job, 409 dead_job_resolved;
//	                                      a run's ID with no open dead job: 409 run_closed or run_not_finished; 404
//	POST /v1/dead-jobs/{id}/discard       the same
//	POST /v1/ui-sessions/revoke           sign out everywhere: end every web UI session (no body) → 200 {"revoked": N},
//	                                      the live sessions ended; browsers must sign in again with the token
//	GET  /v1/queues                       the flow-controlled queues → 200 {"queues": [...]}: limits, pause, ready and
//	                                      running runs, the oldest ready run's time, rate-limit wait, serving processes
//	POST /v1/queues/{name}/pause          {"reason", "by"} → 200 the queue: no run of it starts; running steps finish,
//	                                      then their runs wait in the queue; 404 for a queue no process defined
//	POST /v1/queues/{name}/resume         {"by"} → 200 the queue: its backlog starts at its limits; 404 likewise
//	GET  /v1/openapi.json                 this API's OpenAPI 3.1 document (routes, statuses, JSON shapes), under the same
//	                                      authentication as the other /v1 routes: a client in another language can be
//	                                      generated from it
//	GET  /healthz, GET /readyz, GET /metrics
//	GET  /ui/...                          the web UI (Options.UI); GET / redirects there
//
// A request with a W3C traceparent header continues its trace: a run it
// starts joins it.
//
// With Options.Token set, /v1 and /metrics require "Authorization: Bearer
// <token>"; the service refuses to listen beyond loopback without one.
// Without one, a request must name localhost, a loopback IP or
// Options.ListenAddr as its Host (403 forbidden_host), so a web page cannot
// reach the API by rebinding its DNS name. Every POST, PUT and DELETE needs
// "Content-Type: application/json" (415 otherwise) and, when it carries an
// Origin header, this service's own origin (403 forbidden_origin): a page
// on another site cannot change state (CSRF).
package httpapi

import (
	"bytes"
	"context"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"

	"github.com/pgdurable/pgdurable/engine"
)

// Options configures the handler.
type Options struct {
	// Token, when set, is the bearer token /v1 and /metrics require.
	Token string
	// MaxBodyBytes bounds request bodies. Default 1 MiB + 4 KiB (a run's
	// largest input plus its envelope).
	MaxBodyBytes int64
	// Metrics serves /metrics; nil serves 404 there.
	Metrics http.Handler
	// Pool is pinged by /readyz (nil: always ready) and holds the web UI's
	// sessions, which POST /v1/ui-sessions/revoke ends (nil: it answers
	// 501).
	Pool *pgxpool.Pool
	// Logger logs request failures (5xx). Default slog.Default().
	Logger *slog.Logger
	// ListenAddr is the address the API is served on (host:port). Without
	// a Token, a request must name it, localhost or a loopback IP in its
	// Host header, so a web page cannot reach the API through a DNS name
	// that it rebinds to 127.0.0.1.
	ListenAddr string
	// UI, when set, is served under /ui/ (package webui's handler), and
	// GET / redirects there. The Host check applies to it; its own
	// sign-in and CSRF checks stand in for the bearer token.
	UI http.Handler
}

// openAPI is the API's OpenAPI 3.1 document, served at GET
// /v1/openapi.json. A test checks it against the routes this package
// registers and validates the answers of its tests against its schemas.
//
//go:embed openapi.json
var openAPI []byte

// New returns the API's handler over e.
func New(e *engine.Engine, opts *Options) http.Handler {
	h, _ := newHandler(e, opts)
	return h
}

// routeMux is a ServeMux that remembers the patterns it is given, so the
// OpenAPI test can hold the document to the routes actually served.
type routeMux struct {
	*http.ServeMux
	patterns *[]string
}

func (m routeMux) Handle(pattern string, h http.Handler) {
	*m.patterns = append(*m.patterns, pattern)
	m.ServeMux.Handle(pattern, h)
}

func (m routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// newHandler is New, and the patterns it registered, in the order given.
func newHandler(e *engine.Engine, opts *Options) (http.Handler, []string) {
	o := Options{}
	if opts != nil {
		o = *opts
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 1<<20 + 4<<10
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	a := &api{e: e, opts: o}
	var patterns []string
	mux := routeMux{http.NewServeMux(), &patterns}
	v1 := routeMux{http.NewServeMux(), &patterns}
	v1.HandleFunc("POST /v1/workflows/{name}/runs", a.startRun)
	v1.HandleFunc("POST /v1/workflows/{name}/signal-with-start", a.signalWithStart)
	v1.HandleFunc("GET /v1/runs/{run_id}", a.getRun)
	v1.HandleFunc("GET /v1/runs", a.listRuns)
	v1.HandleFunc("POST /v1/runs/{run_id}/cancel", a.cancelRun)
	v1.HandleFunc("POST /v1/runs/{run_id}/start-now", a.startNow)
	v1.HandleFunc("POST /v1/runs/{run_id}/terminate", a.terminateRun)
	v1.HandleFunc("GET /v1/workflows", a.listWorkflows)
	v1.HandleFunc("POST /v1/bulk/cancel-runs", a.bulkCancel)
	v1.HandleFunc("POST /v1/runs/prune", a.pruneRuns)
	v1.HandleFunc("POST /v1/bulk/replay-dead-jobs", a.bulkDeadJobs(true))
	v1.HandleFunc("POST /v1/bulk/discard-dead-jobs", a.bulkDeadJobs(false))
	v1.HandleFunc("POST /v1/runs/{run_id}/signals/{name}", a.signal)
	v1.HandleFunc("GET /v1/schedules", a.listSchedules)
	v1.HandleFunc("POST /v1/schedules", a.createSchedule)
	v1.HandleFunc("GET /v1/schedules/{name}", a.getSchedule)
	v1.HandleFunc("PUT /v1/schedules/{name}", a.updateSchedule)
	v1.HandleFunc("DELETE /v1/schedules/{name}", a.scheduleAction(deleteSchedule))
	v1.HandleFunc("POST /v1/schedules/{name}/pause", a.scheduleAction(pauseSchedule))
	v1.HandleFunc("POST /v1/schedules/{name}/resume", a.scheduleAction(resumeSchedule))
	v1.HandleFunc("POST /v1/schedules/{name}/trigger", a.triggerSchedule)
	v1.HandleFunc("GET /v1/dead-jobs", a.listDeadJobs)
	v1.HandleFunc("GET /v1/dead-jobs/{id}", a.getDeadJob)
	v1.HandleFunc("POST /v1/dead-jobs/{id}/replay", a.resolveDeadJob(e.ReplayDeadJob))
	v1.HandleFunc("POST /v1/dead-jobs/{id}/discard", a.resolveDeadJob(e.DiscardDeadJob))
	v1.HandleFunc("POST /v1/ui-sessions/revoke", a.revokeUISessions)
	v1.HandleFunc("GET /v1/queues", a.listQueues)
	v1.HandleFunc("POST /v1/queues/{name}/pause", a.pauseQueue)
	v1.HandleFunc("POST /v1/queues/{name}/resume", a.resumeQueue)
	v1.HandleFunc("GET /v1/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openAPI)
	})
	mux.ServeMux.Handle("/v1/", a.auth(a.sameSite(a.limitBody(traced(jsonMisses(v1.ServeMux))))))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", a.ready)
	if o.Metrics != nil {
		mux.Handle("GET /metrics", a.auth(o.Metrics))
	}
	if o.UI != nil {
		mux.Handle("/ui/", o.UI)
		mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/ui/", http.StatusSeeOther)
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no route %s %s", r.Method, r.URL.Path))
	})
	return a.knownHost(cleanPaths(mux)), patterns
}

// traced continues the trace of a request that carries a W3C traceparent
// header: a run it starts stores that trace context, so the run's spans
// join the client's trace (engine.Config.TracerProvider).
func traced(next http.Handler) http.Handler {
	prop := propagation.TraceContext{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("traceparent") != "" {
			r = r.WithContext(prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
		}
		next.ServeHTTP(w, r)
	})
}

// cleanPaths answers a path with . or .. segments or doubled slashes with a
// JSON 400, where Go's mux would redirect (a POST) to the cleaned path.
func cleanPaths(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if clean := path.Clean(p); clean != p && clean+"/" != p {
			writeError(w, http.StatusBadRequest, "invalid_path", fmt.Sprintf("path %s is not in canonical form", strconv.Quote(p)))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// knownHost refuses, when no token is set or the API listens on loopback, a
// request whose Host header is not this service's: a page on another site
// that rebinds its own DNS name to 127.0.0.1 sends its own name as Host
// (DNS rebinding).
func (a *api) knownHost(next http.Handler) http.Handler {
	listenHost, _, _ := net.SplitHostPort(a.opts.ListenAddr)
	if ip := net.ParseIP(listenHost); a.opts.Token != "" && !strings.EqualFold(listenHost, "localhost") && (ip == nil || !ip.IsLoopback()) {
		// Beyond loopback, with a token, the token is the guard and a proxy
		// may send any Host. On loopback a page could still rebind its
		// name to 127.0.0.1 and try tokens: the Host check stays.
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
		ip := net.ParseIP(host)
		if !strings.EqualFold(host, "localhost") && (ip == nil || !ip.IsLoopback()) && (listenHost == "" || host != listenHost) {
			writeError(w, http.StatusForbidden, "forbidden_host",
				fmt.Sprintf("Host %s is not this service's address: name localhost, a loopback IP or the listen address", strconv.Quote(r.Host)))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// sameSite refuses a state-changing request that a web page on another
// site could have sent (CSRF): one whose Origin is not this service's, and
// one without a JSON content type, which a page can only send after a CORS
// preflight that this API never answers. Reads are safe: a page on another
// site cannot read their answers.
func (a *api) sameSite(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			next.ServeHTTP(w, r)
			return
		}
		if origin := r.Header.Get("Origin"); origin != "" {
			u, err := url.Parse(origin)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
				writeError(w, http.StatusForbidden, "forbidden_origin",
					fmt.Sprintf("a %s from origin %s is refused: only this service's own origin may change state", r.Method, strconv.Quote(origin)))
				return
			}
		}
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type",
				fmt.Sprintf("a %s needs Content-Type: application/json (got %s)", r.Method, strconv.Quote(r.Header.Get("Content-Type"))))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// jsonMisses answers requests mux has no route for in the API's JSON
// error shape: 404, or 405 with the Allow header when only the method is
// wrong (Go's mux knows which).
func jsonMisses(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r) // sets the path values that Handler does not
			return
		}
		probe := &statusProbe{header: http.Header{}}
		h.ServeHTTP(probe, r)
		if allow := probe.header.Get("Allow"); probe.status == http.StatusMethodNotAllowed && allow != "" {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow))
			return
		}
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no route %s %s", r.Method, r.URL.Path))
	})
}

// statusProbe records what a mux's own 404/405 handler would answer.
type statusProbe struct {
	header http.Header
	status int
}

func (p *statusProbe) Header() http.Header         { return p.header }
func (p *statusProbe) Write(b []byte) (int, error) { return len(b), nil }
func (p *statusProbe) WriteHeader(code int)        { p.status = code }

type api struct {
	e    *engine.Engine
	opts Options
}

func (a *api) auth(next http.Handler) http.Handler {
	if a.opts.Token == "" {
		return next
	}
	want := []byte(a.opts.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The scheme is case-insensitive (RFC 9110), the token is not.
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(token), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="pgdurable"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", "a valid bearer token is required")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (a *api) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, a.opts.MaxBodyBytes)
		next.ServeHTTP(w, r)
	})
}

func (a *api) ready(w http.ResponseWriter, r *http.Request) {
	if a.opts.Pool != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := a.opts.Pool.Ping(ctx); err != nil {
			// The probe is open to all: the details go to the log only.
			a.opts.Logger.Warn("readiness probe: database unreachable", "error", err)
			writeError(w, http.StatusServiceUnavailable, "not_ready", "database unreachable")
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// ErrorBody is every error response: {"error": {"code", "message"}}. The
// CLI's --json prints errors in the same shape.
type ErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// NewErrorBody is an error response with code and message.
func NewErrorBody(code, message string) ErrorBody {
	var b ErrorBody
	b.Error.Code, b.Error.Message = code, message
	return b
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, NewErrorBody(code, message))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// Compact: indentation costs quadratic space in a value's nesting, and
	// clients pipe answers through jq to read them.
	_ = json.NewEncoder(escapeC1{w}).Encode(v)
}

// readBody reads the request body: 413 over the limit, 400 for a body that
// cannot be read (a malformed chunked encoding, a cut connection).
func (a *api) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(r.Body)
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		a.engineError(w, r, err)
		return nil, false
	case err != nil:
		writeError(w, http.StatusBadRequest, "invalid_body", "reading the request body: "+err.Error())
		return nil, false
	}
	return body, true
}

// readJSON decodes the request body into v: exactly one JSON value, no
// unknown fields. On failure it answers (413 over the body limit, 400
// invalid_json saying the body must be shape) and returns false.
func (a *api) readJSON(w http.ResponseWriter, r *http.Request, v any, shape string) bool {
	body, ok := a.readBody(w, r)
	if !ok {
		return false
	}
	if !utf8.Valid(body) {
		// encoding/json would turn the bad bytes into U+FFFD: two workflow
		// IDs that differ in them would name one run.
		writeError(w, http.StatusBadRequest, "invalid_json", "request body is not valid UTF-8")
		return false
	}
	if esc := loneSurrogate(body); esc != "" {
		// encoding/json turns an unpaired surrogate escape into U+FFFD
		// too, with the same effect.
		writeError(w, http.StatusBadRequest, "invalid_json",
			"request body holds the escape "+esc+", half of a UTF-16 surrogate pair without its other half, which is no character")
		return false
	}
	if bytes.Equal(bytes.TrimSpace(body), []byte("null")) {
		// encoding/json decodes null into a struct as nothing at all: a
		// start would take it for a start without an ID, and start a new
		// run at every retry of a careless client.
		writeError(w, http.StatusBadRequest, "invalid_json", "request body must be "+shape+", not null")
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_json", "request body must be "+shape+": "+syntaxAt(err, len(body)))
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "invalid_json", "request body holds more than one JSON value")
		return false
	}
	return true
}

// syntaxAt says a decoding error of a body of n bytes, with, when the
// body is not valid JSON, where it breaks: the byte offset encoding/json
// reports (*json.SyntaxError's Offset: the bytes read when it found the
// error), or n for a body that ends too soon.
func syntaxAt(err error, n int) string {
	var syntax *json.SyntaxError
	switch {
	case errors.As(err, &syntax):
		return fmt.Sprintf("%v at byte offset %d", err, syntax.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return fmt.Sprintf("unexpected end of JSON input at byte offset %d", n)
	}
	return err.Error()
}

// loneSurrogate returns the first \u escape in the JSON text b that is
// half of a UTF-16 surrogate pair without its other half ("" when there
// is none). Outside strings JSON has no backslashes, so every backslash
// in b starts an escape.
func loneSurrogate(b []byte) string {
	hex := func(i int) (rune, bool) {
		if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
			return 0, false
		}
		n, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16)
		return rune(n), err == nil
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		r, ok := hex(i)
		if !ok {
			i++ // a two-character escape: skip its second character
			continue
		}
		switch {
		case r >= 0xD800 && r <= 0xDBFF:
			if low, ok := hex(i + 6); ok && low >= 0xDC00 && low <= 0xDFFF {
				i += 11 // the pair
				continue
			}
			return string(b[i : i+6])
		case r >= 0xDC00 && r <= 0xDFFF:
			return string(b[i : i+6])
		}
		i += 5
	}
	return ""
}

// ErrorCode maps the engine's conditions onto the API's HTTP status and
// error code; anything else is 500 "internal".
func ErrorCode(err error) (status int, code string) {
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return http.StatusRequestEntityTooLarge, "payload_too_large"
	case errors.Is(err, engine.ErrUnknownWorkflow):
		return http.StatusNotFound, "unknown_workflow"
	case errors.Is(err, engine.ErrNotFound):
		return http.StatusNotFound, "not_found"
	case errors.Is(err, engine.ErrInvalidInput):
		return http.StatusBadRequest, "invalid_input"
	case errors.Is(err, engine.ErrWorkflowIDConflict):
		return http.StatusConflict, "workflow_id_conflict"
	case errors.Is(err, engine.ErrScheduleExists):
		return http.StatusConflict, "schedule_exists"
	case errors.Is(err, engine.ErrRunClosed):
		return http.StatusConflict, "run_closed"
	case errors.Is(err, engine.ErrRunNotFinished):
		return http.StatusConflict, "run_not_finished"
	case errors.Is(err, engine.ErrSignalKeyConflict):
		return http.StatusConflict, "signal_key_conflict"
	case errors.Is(err, engine.ErrLimitExceeded):
		return http.StatusConflict, "limit_exceeded"
	case errors.Is(err, engine.ErrDeadJobResolved):
		return http.StatusConflict, "dead_job_resolved"
	case errors.Is(err, engine.ErrDuplicate):
		return http.StatusConflict, "duplicate"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, "unavailable"
	case errors.Is(err, engine.ErrInvalidArgument):
		return http.StatusBadRequest, "invalid_parameter"
	}
	return http.StatusInternalServerError, "internal"
}

// engineError answers err: its status and code, and its message except
// for internal errors, which are logged and not shown.
func (a *api) engineError(w http.ResponseWriter, r *http.Request, err error) {
	status, code := ErrorCode(err)
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeError(w, status, code, fmt.Sprintf("request body is over %d bytes", tooBig.Limit))
	case code == "unavailable":
		writeError(w, status, code, "the request was cancelled or timed out")
	case status == http.StatusInternalServerError:
		a.opts.Logger.Error("http api request failed", "method", r.Method, "path", r.URL.Path, "error", err)
		writeError(w, status, code, "internal error; see the service's logs")
	default:
		writeError(w, status, code, err.Error())
	}
}
