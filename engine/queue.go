package engine

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine/internal/flow"
	"github.com/pgdurable/pgdurable/engine/internal/maintenance"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// Rate is a rate limit: at most Limit starts per Period, with Burst of
// them at once (0: 1). It is enforced with GCRA (the generic cell rate
// algorithm, as in network traffic shaping): one start every
// Period/Limit, up to Burst of them back to back after a quiet spell.
// GCRA keeps one time per queue or key in the database rather than a row
// per start, and says exactly when the next start may go, so a saturated
// queue is paced evenly instead of letting a whole period's worth through
// at each period's start, as a fixed window does. The zero Rate is no
// limit.
type Rate struct {
	Limit  int           `json:"limit"`
	Period time.Duration `json:"period_ns"`
	Burst  int           `json:"burst"`
}

func (r Rate) check(what string) error {
	switch {
	case r == Rate{}:
		return nil
	case r.Limit <= 0 || r.Period <= 0:
		return fmt.Errorf("%w: %s needs a Limit and a Period above 0 (got %d per %s)", ErrInvalidArgument, what, r.Limit, r.Period)
	case r.Period < time.Millisecond:
		return fmt.Errorf("%w: %s Period %s is under a millisecond", ErrInvalidArgument, what, r.Period)
	case r.Burst < 0 || r.Burst > r.Limit:
		return fmt.Errorf("%w: %s Burst %d is not between 0 and its Limit %d", ErrInvalidArgument, what, r.Burst, r.Limit)
	}
	return nil
}

func (r Rate) def() store.Rate { return store.Rate{Limit: r.Limit, Period: r.Period, Burst: r.Burst} }

// QueueOpts define a flow-controlled queue (Engine.RegisterQueue). The
// limits hold across every process on the database; a process that
// registers the queue writes them to the database when it starts, so the
// definition of the process that started last is in force (keep them
// equal across a deployment). Zero is no limit.
type QueueOpts struct {
	// Workers is how many of the queue's runs this process executes at
	// once (default Config.MaxWorkers). They are the queue's own: runs of
	// other queues, and of none, use other workers.
	Workers int
	// Concurrency is the most runs of the queue that execute at once,
	// across every process. A run holds its slot while a delivery holds
	// its lease: a sleeping run, or one waiting for a signal, holds none,
	// and the slot of a process that died comes back when its lease
	// expires (Config.LeaseDuration).
	Concurrency int
	// KeyConcurrency is the most runs of one key (StartOpts.QueueKey,
	// WorkflowOpts.QueueKey) that execute at once; 1 runs each key's runs
	// one at a time, in the order they were started. Runs started without
	// a key share the empty key.
	KeyConcurrency int
	// RateLimit bounds the queue's starts (first deliveries and
	// deliveries after a sleep or a wait alike); KeyRateLimit each key's.
	RateLimit, KeyRateLimit Rate
	// PriorityAging bounds how long a low-priority run waits behind
	// higher ones (default 1 minute; negative: never, strict priority):
	// a ready run that has waited this long while runs of a higher
	// priority went first is admitted ahead of them, oldest first. So no
	// run waits longer than PriorityAging plus the time the queue takes to
	// start the runs that became ready before it.
	PriorityAging time.Duration
}

// defaultPriorityAging is QueueOpts.PriorityAging's default.
const defaultPriorityAging = time.Minute

// Limits on what a start may ask of a queue.
const (
	// MaxPriority and MinPriority bound StartOpts.Priority.
	MaxPriority = 1000
	MinPriority = -1000
	// MaxQueueKeyBytes bounds a queue key.
	MaxQueueKeyBytes = 200
	// MaxDeduplicationIDBytes bounds StartOpts.DeduplicationID.
	MaxDeduplicationIDBytes = 400
	// MaxKeyWeight and MinKeyWeight bound StartOpts.KeyWeight: a run's
	// share of its key's fair-queuing time is 1/weight, so a weight near 0
	// would push the queue's fair-queuing clock toward infinity.
	MaxKeyWeight = 1000
	MinKeyWeight = 0.001
)

// flowQueue is a queue this process serves.
type flowQueue struct {
	opts QueueOpts
	// implicit: a registered workflow names it, RegisterQueue did not:
	// this process does not define its limits.
	implicit bool
	admitter *flow.Admitter
}

// DefineQueue is RegisterQueue as a Registration: Engine.Register(
// DefineQueue(name, opts)) registers the queue as RegisterQueue(name,
// opts) does, with its errors. A package that defines workflows running
// in the queue hands it out with them:
//
//	func Registrations() []engine.Registration {
//		return []engine.Registration{checkout, engine.DefineQueue("payments", engine.QueueOpts{KeyConcurrency: 1})}
//	}
func DefineQueue(name string, opts QueueOpts) Registration { return queueDef{name, opts} }

type queueDef struct {
	name string
	opts QueueOpts
}

func (q queueDef) register(e *Engine) error { return e.RegisterQueue(q.name, q.opts) }

// DefineRateLimit is RegisterRateLimit as a Registration (see
// DefineQueue): Engine.Register(DefineRateLimit(name, r)) registers the
// rate limit as RegisterRateLimit(name, r) does, with its errors.
func DefineRateLimit(name string, r Rate) Registration { return rateDef{name, r} }

type rateDef struct {
	name string
	rate Rate
}

func (d rateDef) register(e *Engine) error { return e.RegisterRateLimit(d.name, d.rate) }

// RegisterQueue defines the flow-controlled queue name (1 to 200 bytes)
// and makes this process serve it with opts.Workers workers: it admits the
// queue's ready runs that fit the queue's limits. Runs enter the queue by
// WorkflowOpts.Queue or StartOpts.Queue; a run of a queue that no
// started process registers waits, pending. Call before Start.
//
// Errors: ErrInvalidArgument (a bad name or option, or the engine was
// started), and an error when name was registered before.
func (e *Engine) RegisterQueue(name string, opts QueueOpts) error {
	if err := checkName("queue name", name, 200); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	switch {
	case opts.Workers < 0 || opts.Concurrency < 0 || opts.KeyConcurrency < 0:
		return fmt.Errorf("%w: queue %q: Workers, Concurrency and KeyConcurrency must not be negative", ErrInvalidArgument, name)
	}
	if err := opts.RateLimit.check("queue " + name + " RateLimit"); err != nil {
		return err
	}
	if err := opts.KeyRateLimit.check("queue " + name + " KeyRateLimit"); err != nil {
		return err
	}
	opts.Workers = cmp.Or(opts.Workers, e.cfg.MaxWorkers)
	if opts.PriorityAging == 0 {
		opts.PriorityAging = defaultPriorityAging
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started {
		return fmt.Errorf("%w: RegisterQueue(%q) after Start", ErrInvalidArgument, name)
	}
	if _, dup := e.flowQueues[name]; dup {
		return fmt.Errorf("pgdurable: queue %q registered twice", name)
	}
	e.serveQueue(name, opts, false)
	return nil
}

// serveQueue makes this process serve queue name with opts (implicit: a
// registered workflow names it; its limits are left as they are). The
// caller holds e.mu.
func (e *Engine) serveQueue(name string, opts QueueOpts, implicit bool) {
	if e.flowQueues == nil {
		e.flowQueues = map[string]*flowQueue{}
	}
	q := &flowQueue{opts: opts, implicit: implicit}
	q.admitter = &flow.Admitter{Queue: name, Workers: opts.Workers, Lease: e.cfg.LeaseDuration, Poll: admitPoll,
		Now: e.now, Log: e.log, DB: e.db, Versions: e.takenVersions,
		Conn: func(ctx context.Context) (store.DBTX, func(), error) {
			c, err := e.pool.Acquire(ctx)
			if err != nil {
				return nil, nil, err
			}
			return e.on(c), c.Release, nil
		},
		Run: e.runAdmitted}
	e.flowQueues[name] = q
}

// serveWorkflowQueues makes this process serve the queues its registered
// workflows name that it does not register itself (see Config.Queues).
func (e *Engine) serveWorkflowQueues() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, w := range e.versions {
		if _, ok := e.flowQueues[w.queue]; w.queue != "" && !ok {
			e.serveQueue(w.queue, QueueOpts{Workers: e.cfg.MaxWorkers}, true)
			e.log.Info("serving the queue a registered workflow names, with the limits other processes define",
				"queue", w.queue, "workflow", w.name, "workers", e.cfg.MaxWorkers)
		}
	}
}

// admitPoll is how often an admitter looks for runs made ready, and slots
// freed, by other processes.
const admitPoll = 100 * time.Millisecond

// def is q's definition as the database keeps it.
func (q *flowQueue) def(name string) store.QueueDef {
	aging := max(q.opts.PriorityAging, 0)
	return store.QueueDef{Name: name, Concurrency: q.opts.Concurrency, KeyConcurrency: q.opts.KeyConcurrency,
		Rate: q.opts.RateLimit.def(), KeyRate: q.opts.KeyRateLimit.def(), PriorityAging: aging}
}

// defineFlow writes the definitions of the queues and rate limits this
// process registers.
func (e *Engine) defineFlow(ctx context.Context) error {
	e.mu.Lock()
	queues, limits := maps.Clone(e.flowQueues), maps.Clone(e.rateLimits)
	e.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(queues)) {
		define := store.DefineQueue
		if queues[name].implicit {
			define = store.EnsureQueue
		}
		if err := define(ctx, e.db, queues[name].def(name)); err != nil {
			return err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(limits)) {
		if err := store.DefineRateLimit(ctx, e.db, name, limits[name].def()); err != nil {
			return err
		}
	}
	return nil
}

// startQueues starts the admitters of the queues this process serves,
// which run until ctx ends.
func (e *Engine) startQueues(ctx context.Context) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, q := range e.flowQueues {
		go q.admitter.Serve(ctx)
	}
}

// takenVersions are the workflow versions this process executes: each
// registered version, and, for a workflow whose latest version sets
// AutoUpgrade, every version up to it.
func (e *Engine) takenVersions() []store.VersionRange {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]store.VersionRange, 0, len(e.versions))
	for k := range e.versions {
		out = append(out, store.VersionRange{Name: k.name, Lo: k.version, Hi: k.version})
	}
	for _, w := range e.workflows {
		if w.autoUpgrade {
			out = append(out, store.VersionRange{Name: w.name, Lo: 0, Hi: w.version})
		}
	}
	return out
}

// pokeQueue asks this process's admitter of queue, if it serves it, for
// an admission.
func (e *Engine) pokeQueue(queue string) {
	e.mu.Lock()
	q := e.flowQueues[queue]
	e.mu.Unlock()
	if q != nil {
		q.admitter.Poke()
	}
}

// setPaused tells this process's admitter of queue, if it serves it, of a
// pause or resume made here.
func (e *Engine) setPaused(queue string, paused bool) {
	e.mu.Lock()
	q := e.flowQueues[queue]
	e.mu.Unlock()
	if q != nil {
		q.admitter.SetPaused(paused)
	}
}

// runAdmitted executes a run its queue's admission claimed here, on a
// goroutine of its own; done frees the queue's worker when it ends. False
// when the engine is stopping: the claim then lapses with its lease, and
// the sweep makes the run ready again.
func (e *Engine) runAdmitted(c *store.ClaimedRun, token uuid.UUID, sent time.Time, done func()) bool {
	if !e.track() {
		return false
	}
	go func() {
		defer e.dispatched.Done()
		defer done()
		if err := e.runClaimed(e.dispatchCtx, c, token, sent); err != nil {
			e.log.Warn("delivery of an admitted run failed; the run is redelivered when its lease expires",
				"run_id", c.RunID, "error", err)
		}
	}()
	return true
}

// queueOf is the queue, key, priority and tag step of a start of wf with
// input and opts; an empty queue for none.
func queueOf(wf registered, input []byte, opts *StartOpts) (store.NewRun, error) {
	var r store.NewRun
	r.FlowQueue = wf.queue
	if opts != nil && opts.Queue != "" {
		r.FlowQueue = opts.Queue
	}
	if r.FlowQueue == "" {
		if opts != nil && (opts.QueueKey != "" || opts.Priority != 0 || opts.KeyWeight != 0 || opts.DeduplicationID != "") {
			return r, fmt.Errorf("%w: StartOpts.QueueKey, Priority, KeyWeight and DeduplicationID need a queue (StartOpts.Queue or WorkflowOpts.Queue)", ErrInvalidArgument)
		}
		return r, nil
	}
	if err := checkName("queue name", r.FlowQueue, 200); err != nil {
		return r, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if opts != nil && opts.QueueKey != "" {
		r.FlowKey = opts.QueueKey
	} else if wf.queueKey != nil {
		key, err := wf.queueKey(input)
		if err != nil {
			return r, fmt.Errorf("%w: WorkflowOpts.QueueKey of workflow %q: %v", ErrInvalidInput, wf.name, err)
		}
		r.FlowKey = key
	}
	if err := checkQueueKey(r.FlowKey); err != nil {
		return r, err
	}
	r.TagStep = 1
	if opts != nil {
		switch {
		case opts.Priority < MinPriority || opts.Priority > MaxPriority:
			return r, fmt.Errorf("%w: StartOpts.Priority %d is not between %d and %d", ErrInvalidArgument, opts.Priority, MinPriority, MaxPriority)
		case opts.KeyWeight != 0 && !(opts.KeyWeight >= MinKeyWeight && opts.KeyWeight <= MaxKeyWeight):
			return r, fmt.Errorf("%w: StartOpts.KeyWeight (key_weight) %g is not between %g and %d", ErrInvalidArgument, opts.KeyWeight, MinKeyWeight, MaxKeyWeight)
		case !storable(opts.DeduplicationID, MaxDeduplicationIDBytes):
			return r, fmt.Errorf("%w: StartOpts.DeduplicationID (deduplication_id) is over %d bytes, not UTF-8 or holds a NUL", ErrInvalidArgument, MaxDeduplicationIDBytes)
		}
		r.Priority, r.DedupID = opts.Priority, opts.DeduplicationID
		if opts.KeyWeight > 0 {
			r.TagStep = 1 / opts.KeyWeight
		}
	}
	return r, nil
}

func checkQueueKey(key string) error {
	if !storable(key, MaxQueueKeyBytes) {
		return fmt.Errorf("%w: queue key %q is over %d bytes, not UTF-8 or holds a NUL", ErrInvalidArgument, truncateText(key, 64), MaxQueueKeyBytes)
	}
	return nil
}

// KeyOf builds a WorkflowOpts.QueueKey from a function of the workflow's
// input: the input is decoded as In (an input that does not decode fails
// the start with ErrInvalidInput).
//
//	QueueKey: engine.KeyOf(func(o Order) string { return o.CustomerID })
func KeyOf[In any](key func(In) string) func(input json.RawMessage) (string, error) {
	return func(input json.RawMessage) (string, error) {
		var in In
		if err := json.Unmarshal(input, &in); err != nil {
			return "", err
		}
		return key(in), nil
	}
}

// ErrDuplicate is returned by a start whose StartOpts.DeduplicationID is
// held by an open run of its queue (unless StartOpts.ReturnDuplicate is
// set: then the start returns that run, StartResult.Deduplicated).
var ErrDuplicate = errors.New("pgdurable: deduplication ID held by an open run")

// noteQueued sets run.WaitingFor and WaitingSince on a ready run of a
// flow-controlled queue: what holds it there (see Run.WaitingFor), read
// from the queue's row, its live processes and its key's runs.
func (e *Engine) noteQueued(ctx context.Context, run *Run) error {
	if run.readyAt == nil || run.Queue == "" || run.WaitingFor != "" {
		return nil
	}
	run.WaitingSince = run.readyAt
	queues, err := e.ListQueues(ctx)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(queues, func(q QueueInfo) bool { return q.Name == run.Queue })
	if i < 0 {
		run.WaitingFor = fmt.Sprintf("a process that serves queue %s", run.Queue)
		return nil
	}
	q := queues[i]
	now := e.now()
	switch {
	case q.Paused:
		run.WaitingFor = fmt.Sprintf("queue %s is paused", run.Queue)
		var why []string
		if q.PauseReason != "" {
			why = append(why, q.PauseReason)
		}
		if q.PausedBy != "" {
			why = append(why, "by "+q.PausedBy)
		}
		if len(why) > 0 {
			run.WaitingFor += " (" + strings.Join(why, ", ") + ")"
		}
		return nil
	case len(q.Processes) == 0:
		run.WaitingFor = fmt.Sprintf("a process that serves queue %s", run.Queue)
		return nil
	case q.Concurrency > 0 && q.Running >= q.Concurrency:
		run.WaitingFor = fmt.Sprintf("a slot of queue %s (%d of %d running)", run.Queue, q.Running, q.Concurrency)
		return nil
	case q.RateLimitedUntil != nil && q.RateLimitedUntil.After(now):
		run.WaitingFor = fmt.Sprintf("queue %s's rate limit (next start at %s)", run.Queue, q.RateLimitedUntil.UTC().Format(time.RFC3339Nano))
		return nil
	}
	w, err := store.KeyWaitOf(ctx, e.db, store.ReadyRun{Queue: run.Queue, Key: run.QueueKey, RunID: run.RunID, Now: now})
	if err != nil {
		return err
	}
	switch {
	case q.KeyConcurrency > 0 && w.Running >= q.KeyConcurrency:
		run.WaitingFor = fmt.Sprintf("a slot of key %q in queue %s (%d of %d running)", run.QueueKey, run.Queue, w.Running, q.KeyConcurrency)
	case q.KeyRateLimit != (Rate{}) && w.RateTAT != nil && rateNext(q.KeyRateLimit, *w.RateTAT).After(now):
		run.WaitingFor = fmt.Sprintf("key %q's rate limit in queue %s (next start at %s)", run.QueueKey, run.Queue,
			rateNext(q.KeyRateLimit, *w.RateTAT).UTC().Format(time.RFC3339Nano))
	case w.Ahead >= store.MaxCountedAhead:
		run.WaitingFor = fmt.Sprintf("its turn in queue %s (%d or more runs ahead)", run.Queue, w.Ahead)
	default:
		run.WaitingFor = fmt.Sprintf("its turn in queue %s (%d runs ahead)", run.Queue, w.Ahead)
	}
	return nil
}

// rateNext is when a rate with state tat lets the next start go.
func rateNext(r Rate, tat time.Time) time.Time {
	interval := r.Period / time.Duration(r.Limit)
	return tat.Add(-time.Duration(max(r.Burst, 1)-1) * interval)
}

// QueueInfo is a flow-controlled queue as Engine.ListQueues reads it.
type QueueInfo struct {
	Name string `json:"name"`
	// Defined is false for a queue that runs name but that no process
	// has registered (RegisterQueue): its runs wait for one.
	Defined        bool          `json:"defined"`
	Concurrency    int           `json:"concurrency"`
	KeyConcurrency int           `json:"key_concurrency"`
	RateLimit      Rate          `json:"rate_limit"`
	KeyRateLimit   Rate          `json:"key_rate_limit"`
	PriorityAging  time.Duration `json:"priority_aging_ns"`
	// Paused, with when, by whom and why (PauseQueue).
	Paused      bool       `json:"paused"`
	PausedAt    *time.Time `json:"paused_at,omitempty"`
	PausedBy    string     `json:"paused_by,omitempty"`
	PauseReason string     `json:"pause_reason,omitempty"`
	// Ready is how many runs wait in the queue for a slot, and
	// OldestReadyAt since when the oldest has; Running how many hold a
	// live lease (a slot).
	Ready         int        `json:"ready"`
	Running       int        `json:"running"`
	OldestReadyAt *time.Time `json:"oldest_ready_at,omitempty"`
	// RateLimitedUntil is when the queue's rate limit lets the next run
	// start, when that is later than now.
	RateLimitedUntil *time.Time `json:"rate_limited_until,omitempty"`
	// Processes are the live engine processes that serve the queue.
	Processes []QueueProcess `json:"processes"`
}

// QueueProcess is a live engine process that serves a queue, with its
// workers for it.
type QueueProcess struct {
	ID       uuid.UUID `json:"id"`
	Hostname string    `json:"hostname"`
	PID      int       `json:"pid"`
	Workers  int       `json:"workers"`
}

// ListQueues lists the flow-controlled queues, by name: those a process
// defined (RegisterQueue) and those that runs name, with what holds their
// runs. Counting a queue's ready runs reads its backlog's index, so it
// is meant for people and metrics, not for every request.
func (e *Engine) ListQueues(ctx context.Context) ([]QueueInfo, error) {
	now := e.now()
	rows, err := store.ListQueues(ctx, e.db, now)
	if err != nil {
		return nil, fmt.Errorf("pgdurable: %w", err)
	}
	procs, err := store.LiveProcesses(ctx, e.db, maintenance.ProcessLive)
	if err != nil {
		return nil, fmt.Errorf("pgdurable: %w", err)
	}
	out := make([]QueueInfo, 0, len(rows))
	for _, r := range rows {
		q := QueueInfo{Name: r.Def.Name, Defined: r.Defined, Concurrency: r.Def.Concurrency, KeyConcurrency: r.Def.KeyConcurrency,
			RateLimit: rateOf(r.Def.Rate), KeyRateLimit: rateOf(r.Def.KeyRate), PriorityAging: r.Def.PriorityAging,
			Paused: r.PausedAt != nil, PausedAt: r.PausedAt, PausedBy: deref(r.PausedBy), PauseReason: deref(r.Reason),
			Ready: r.Ready, Running: r.Running, OldestReadyAt: r.OldestReady, Processes: []QueueProcess{}}
		if q.RateLimit != (Rate{}) && r.RateTAT != nil {
			if next := rateNext(q.RateLimit, *r.RateTAT); next.After(now) {
				q.RateLimitedUntil = &next
			}
		}
		for _, p := range procs {
			for _, pq := range p.Queues {
				if pq.Name == q.Name {
					q.Processes = append(q.Processes, QueueProcess{ID: p.ID, Hostname: p.Hostname, PID: p.PID, Workers: pq.Workers})
				}
			}
		}
		out = append(out, q)
	}
	return out, nil
}

func rateOf(r store.Rate) Rate { return Rate{Limit: r.Limit, Period: r.Period, Burst: r.Burst} }

// PauseOpts record who paused a queue and why (each at most 400 bytes),
// for the operators who read it in the queue's listing and in the logs.
type PauseOpts struct {
	By     string
	Reason string
}

// PauseQueue pauses queue for every process: no run of it is admitted,
// runs that are executing finish the step they are in and then wait in
// the queue (ready) until ResumeQueue, and timers and signals keep
// arriving (the runs they wake wait in the queue too). It takes effect in
// each process at its next look at the queue (within about 100 ms). A
// paused queue stays paused under its first pause's record. Errors:
// ErrNotFound (no process defined the queue), ErrInvalidArgument.
func (e *Engine) PauseQueue(ctx context.Context, queue string, opts *PauseOpts) error {
	var o PauseOpts
	if opts != nil {
		o = *opts
	}
	if !storable(o.By, 400) || !storable(o.Reason, 400) {
		return fmt.Errorf("%w: PauseOpts.By and Reason must be UTF-8 of at most 400 bytes without NUL", ErrInvalidArgument)
	}
	if err := checkName("queue name", queue, 200); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	was, err := store.PauseQueue(ctx, e.db, store.Pause{Queue: queue, By: o.By, Reason: o.Reason, Now: e.now()})
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: queue %q is not defined (no process has registered it)", ErrNotFound, queue)
	}
	if err != nil {
		return fmt.Errorf("pgdurable: %w", err)
	}
	if was {
		e.log.Warn("queue paused: no run of it starts until it is resumed", "queue", queue, "by", o.By, "reason", o.Reason)
	}
	e.setPaused(queue, true)
	return nil
}

// ResumeQueue resumes a paused queue: its backlog is admitted again at the
// queue's limits (a queue not paused is left as it is). by says who, for
// the log. Errors: ErrNotFound (no process defined the queue).
func (e *Engine) ResumeQueue(ctx context.Context, queue, by string) error {
	if err := checkName("queue name", queue, 200); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	was, err := store.ResumeQueue(ctx, e.db, queue)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: queue %q is not defined (no process has registered it)", ErrNotFound, queue)
	}
	if err != nil {
		return fmt.Errorf("pgdurable: %w", err)
	}
	if was {
		e.log.Warn("queue resumed", "queue", queue, "by", truncateText(by, 400))
	}
	e.setPaused(queue, false)
	return nil
}

// RegisterRateLimit defines the rate limit name (1 to 200 bytes) that
// steps and activities name in StepOpts.RateLimit and
// ActivityOpts.RateLimit: each attempt takes a turn, across every process
// on the database, at rate r (GCRA, as a queue's RateLimit). Like a
// queue's limits, the definition is written to the database when the
// engine starts, and the process that started last decides. Call before
// Start. Errors: ErrInvalidArgument (a bad name or rate, or after Start).
func (e *Engine) RegisterRateLimit(name string, r Rate) error {
	if err := checkName("rate limit name", name, 200); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if r == (Rate{}) {
		return fmt.Errorf("%w: rate limit %q needs a Limit and a Period", ErrInvalidArgument, name)
	}
	if err := r.check("rate limit " + name); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started {
		return fmt.Errorf("%w: RegisterRateLimit(%q) after Start", ErrInvalidArgument, name)
	}
	if e.rateLimits == nil {
		e.rateLimits = map[string]Rate{}
	}
	e.rateLimits[name] = r
	return nil
}

// rateTurnTaken, set by tests, sees each turn taken, with the time the
// limit granted it at: what the limit bounds, where an attempt's own start
// also holds the scheduler's delays.
var rateTurnTaken atomic.Pointer[func(name string, at time.Time)]

// takeTurn waits for a turn of the rate limit name, within ctx: it asks
// the database for one, and sleeps until the time it names when it gets
// none. A database that fails is asked again after a short wait; a limit
// that no process has defined fails permanently.
func (e *Engine) takeTurn(ctx context.Context, name string) error {
	if err := checkName("rate limit name", name, 200); err != nil {
		return Permanent(fmt.Errorf("%w: %v", ErrInvalidArgument, err))
	}
	for failures := 0; ; {
		now := e.now()
		turn, err := store.TakeRate(ctx, e.db, name, now)
		wait := time.Duration(0)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return Permanent(fmt.Errorf("%w: rate limit %q is not defined: no process registers it (Engine.RegisterRateLimit, Config.RateLimits)",
				ErrInvalidArgument, name))
		case err == nil && turn.Taken:
			if f := rateTurnTaken.Load(); f != nil {
				(*f)(name, now)
			}
			return nil
		case err == nil:
			wait = max(turn.NextAt.Sub(e.now()), time.Millisecond)
			failures = 0
		case ctx.Err() != nil:
			return ctx.Err()
		default:
			failures++
			if failures == 1 || failures%100 == 0 {
				e.log.Warn("taking a turn of a rate limit failed; trying again", "rate_limit", name, "error", err)
			}
			wait = min(10*time.Millisecond<<min(failures, 8), 2*time.Second)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Debounce collapses starts of one workflow that share Key (1 to 400
// bytes) into one run: the first start makes a run that waits Window
// before it starts (a delayed start: no worker, no River job), and each
// start with the key while that run still waits replaces its input with
// its own and moves its start to Window after itself, but never later
// than MaxWait after the first start (0: no bound). So 50 starts within a
// second, with a Window of a second, give one run, with the last input,
// a second after the last start. Once the run has started, the next start
// with the key makes a new run. Each start returns the run it made or
// joined (StartResult.Debounced).
type Debounce struct {
	Key     string
	Window  time.Duration
	MaxWait time.Duration
}

// MaxDebounceKeyBytes bounds Debounce.Key.
const MaxDebounceKeyBytes = 400

// apply checks d for a start with opts at now and sets r's debounce.
func (d *Debounce) apply(r *store.NewRun, opts *StartOpts, now time.Time) error {
	switch {
	case d.Key == "" || !storable(d.Key, MaxDebounceKeyBytes):
		return fmt.Errorf("%w: Debounce.Key must be 1 to %d bytes of UTF-8 without NUL", ErrInvalidArgument, MaxDebounceKeyBytes)
	case d.Window <= 0:
		return fmt.Errorf("%w: Debounce.Window %s must be above 0", ErrInvalidArgument, d.Window)
	case d.MaxWait < 0:
		return fmt.Errorf("%w: Debounce.MaxWait %s is negative", ErrInvalidArgument, d.MaxWait)
	case d.MaxWait > 0 && d.MaxWait < d.Window:
		return fmt.Errorf("%w: Debounce.MaxWait %s is shorter than its Window %s", ErrInvalidArgument, d.MaxWait, d.Window)
	case opts.WorkflowID != "" || !opts.StartAt.IsZero() || opts.Delay != 0 || opts.DeduplicationID != "":
		return fmt.Errorf("%w: StartOpts.Debounce is not for a start with a WorkflowID, StartAt, Delay or DeduplicationID", ErrInvalidArgument)
	}
	at := now.Add(d.Window)
	r.StartAt, r.DebounceKey = &at, d.Key
	if d.MaxWait > 0 {
		until := now.Add(d.MaxWait)
		r.DebounceUntil = &until
	}
	return nil
}
