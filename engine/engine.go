package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgdurable/pgdurable/engine/internal/groupcommit"
	"github.com/pgdurable/pgdurable/engine/internal/maintenance"
	"github.com/pgdurable/pgdurable/engine/internal/queue"
	"github.com/pgdurable/pgdurable/engine/internal/store"
	"github.com/pgdurable/pgdurable/storage/migrations"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Config tunes an Engine. A nil *Config takes every default; zero fields
// take their documented default.
type Config struct {
	// Logger receives structured logs with snake_case keys (run_id,
	// workflow, workflow_id, step, seq, attempt, error_class). River's own
	// logs pass through at warning level and above. Default slog.Default().
	Logger *slog.Logger

	// Schema is the PostgreSQL schema that holds the engine's tables and
	// River's, as storage/migrations created them (its Opts.Schema, and
	// engine's --schema, must name the same). Every statement the engine
	// runs names it, so the connections' search_path plays no part: a tx
	// step's own statements resolve names as the application's pool
	// says, and two engines on different schemas of one database never
	// see each other's runs. Lower-case letters, digits and underscores
	// (New refuses other names). Default DefaultSchema.
	Schema string
	// Queue is the River queue the engine's deliveries use. Default
	// "pgdurable". Engines with different Queues on one database work
	// apart. (The flow-controlled queues that bound concurrency and rate
	// are Queues below, RegisterQueue and WorkflowOpts.Queue.)
	Queue string
	// Queues are the flow-controlled queues this process serves, as
	// RegisterQueue registers them, by name. A queue that a registered
	// workflow names (WorkflowOpts.Queue) and that is not here is served
	// too, with MaxWorkers workers and the limits some other process
	// defined (none until one does).
	Queues map[string]QueueOpts
	// RateLimits are the rate limits this process registers
	// (RegisterRateLimit), by name.
	RateLimits map[string]Rate
	// MaxWorkers is how many deliveries this process runs at once, River's
	// and those of runs it started itself (see Workflow.Start). Default
	// 100, at most MaxMaxWorkers. Size the pgx pool to match (pool_max_conns in the URL; pgxpool's
	// default is max(4, CPUs)): a running step holds no connection, but each
	// record write needs one briefly, and River keeps one for LISTEN.
	MaxWorkers int
	// FetchCooldown and FetchPollInterval are River's fetch knobs. River's
	// defaults (100ms, 1s) cap a queue near 1,000 jobs/s and add up to 1 s
	// of latency to bursts; ours default to 2ms and 50ms.
	FetchCooldown     time.Duration
	FetchPollInterval time.Duration

	// LeaseDuration is how long a delivery owns a run without extending
	// its lease. A crashed worker's run is picked up again about this long
	// after its lease was last extended: by the delivery's first record
	// write, then by a heartbeat or a record write once per
	// HeartbeatInterval (writes in between only check the lease). Default
	// 10s; minimum 1s.
	LeaseDuration time.Duration
	// HeartbeatInterval is how often a delivery extends its lease, by a
	// heartbeat while a step runs or with a record write; shorter than
	// LeaseDuration (New refuses it otherwise). Default LeaseDuration/3.
	HeartbeatInterval time.Duration
	// SweepInterval is how often (on average) each engine looks for runs
	// whose lease expired and waiting runs that are due. It bounds how late
	// a retry or timer fires. Default 250ms.
	SweepInterval time.Duration

	// MaxDeliveries is how many consecutive deliveries of a run may die
	// within their first LeaseDuration without recording anything (a
	// worker crash, an OOM kill) before the run is parked as dead with
	// reason crash_loop; deliveries that died older count toward
	// 5 × MaxDeliveries (a run in a long step dies with a worker that
	// another run kills, and is not to blame). Default 10. From the second
	// such delivery in a row the run waits a random delay of up to
	// LeaseDuration × 2^(n-2), at most 4 × LeaseDuration, before the next,
	// so the runs that shared a worker with a poison run stop being
	// redelivered with it and are not parked for its crashes.
	MaxDeliveries int
	// MaxInlineBackoff is the longest retry backoff a delivery waits out
	// in place; longer ones end the delivery and free the worker until the
	// retry is due. Default 1s.
	MaxInlineBackoff time.Duration
	// RetryPolicy fills fields that steps and workflows leave zero;
	// DefaultRetryPolicy fills the rest.
	RetryPolicy *RetryPolicy
	// MaxPayloadBytes bounds what a run stores as JSON: its input, each
	// signal's payload, and every recorded output (of steps, activities
	// and the workflow; a larger one fails with ErrOutputTooLarge).
	// Default 1 MiB.
	MaxPayloadBytes int
	// MaxSignalsPerRun and MaxSignalBytesPerRun bound the signals one run
	// holds, consumed ones included (they are kept so replays can read
	// them, and a run's view lists them): a signal past either bound is
	// refused with ErrLimitExceeded. Defaults 1,000 and 16 MiB.
	MaxSignalsPerRun     int
	MaxSignalBytesPerRun int64
	// Observer receives run and step events for metrics
	// (engine/enginemetrics). Default: none.
	Observer Observer
	// TracerProvider makes the engine's OpenTelemetry spans: one per
	// start ("pgdurable.start <workflow>", under the caller's span), per
	// delivery ("pgdurable.run <workflow>", with its "pgdurable.claim"),
	// and per step attempt ("pgdurable.step <name>"), with the log keys as
	// attributes under "pgdurable." (run_id, workflow, workflow_id, step,
	// seq, attempt, request_id, error_class). A start stores its span's
	// trace context with the run, so every delivery, in any process and
	// after any crash, joins the caller's trace, and step functions get a
	// context that carries the attempt's span (package activities'
	// HTTP helper sends it on as traceparent). Default
	// otel.GetTracerProvider(): the global provider, which records nothing
	// until the program sets one.
	TracerProvider trace.TracerProvider
	// Propagator writes and reads the trace context stored with a run.
	// Default propagation.TraceContext{} (W3C traceparent and tracestate).
	Propagator propagation.TextMapPropagator
	// Retention is how long finished runs are kept (completed, failed,
	// compensated, cancelled, continued, terminated, and dead runs whose
	// dead jobs are resolved): each started engine's sweep deletes those
	// that ended longer ago, with their steps, signals and dead-job rows,
	// and schedule fires as old (see Engine.Prune, which says what is
	// always kept). The first pass runs at the engine's first sweep,
	// which begins 0.5 to 1.5 × SweepInterval after Start (0.125 to 0.375
	// s by default), so a backlog from before Start goes at once; later passes come every 30
	// to 90 s (a minute on average, spread so that engines started
	// together do not prune together). A pass deletes in batches of 500
	// runs for at most 5 s and leaves the rest to the next. A client-only
	// engine (never started) does not prune. Default DefaultRetention (7
	// days); at least MinRetention (a minute); negative keeps them for
	// ever.
	Retention time.Duration
	// VersionWaitAlert is how long a run may wait for a process that
	// registers its workflow version (see WorkflowOpts.Version) before it
	// is overdue: a process that hands such a run back logs an error about
	// it (once every 10 minutes per workflow version), and Stats (the
	// pgdurable_runs_waiting_for_version_overdue metric) counts it. The
	// run keeps waiting: it is never parked or lost for want of a
	// process. Default DefaultVersionWaitAlert (10 minutes); negative
	// never alerts.
	VersionWaitAlert time.Duration
	// Clock is the time timers, signal timeouts, retry backoffs and
	// schedules follow. Default the system clock; tests inject
	// enginetest.Clock to move time.
	Clock Clock
}

// Defaults of the Config fields that an operator tunes most (engine serve
// shows them in its --help): DefaultLeaseDuration for LeaseDuration (the
// HeartbeatInterval default is a third of the lease), DefaultMaxWorkers
// for MaxWorkers, DefaultMaxDeliveries for MaxDeliveries; DefaultRetention
// is Retention's.
// DefaultSchema is the PostgreSQL schema of the engine's tables and River's
// when Config.Schema is empty.
const DefaultSchema = "pgdurable"

const (
	// MaxMaxWorkers is the largest MaxWorkers New takes: River's limit of
	// workers per queue.
	MaxMaxWorkers = 10_000

	DefaultLeaseDuration = 10 * time.Second
	DefaultMaxWorkers    = 100
	DefaultMaxDeliveries = 10
	// DefaultVersionWaitAlert is Config.VersionWaitAlert's default: long
	// enough for a rolling deploy to bring up the processes of a version,
	// short enough to page someone the same hour.
	DefaultVersionWaitAlert = 10 * time.Minute
)

const (
	defaultQueue         = "pgdurable"
	defaultMaxWorkers    = DefaultMaxWorkers
	defaultFetchCooldown = 2 * time.Millisecond
	defaultFetchPoll     = 50 * time.Millisecond
	defaultLease         = DefaultLeaseDuration
	defaultSweepInterval = 250 * time.Millisecond
	defaultMaxDeliveries = DefaultMaxDeliveries
	defaultInlineBackoff = time.Second
	defaultMaxPayload    = 1 << 20
	defaultMaxSignals    = 1000
	defaultSignalBytes   = 16 << 20
)

func (c Config) withDefaults() (Config, error) {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Schema = orDefault(c.Schema, DefaultSchema)
	c.Queue = orDefault(c.Queue, defaultQueue)
	c.MaxWorkers = orDefault(c.MaxWorkers, defaultMaxWorkers)
	c.FetchCooldown = orDefault(c.FetchCooldown, defaultFetchCooldown)
	c.FetchPollInterval = orDefault(c.FetchPollInterval, max(defaultFetchPoll, c.FetchCooldown))
	c.LeaseDuration = orDefault(c.LeaseDuration, defaultLease)
	c.HeartbeatInterval = orDefault(c.HeartbeatInterval, c.LeaseDuration/3)
	c.SweepInterval = orDefault(c.SweepInterval, defaultSweepInterval)
	c.MaxDeliveries = orDefault(c.MaxDeliveries, defaultMaxDeliveries)
	c.MaxInlineBackoff = orDefault(c.MaxInlineBackoff, defaultInlineBackoff)
	c.MaxPayloadBytes = orDefault(c.MaxPayloadBytes, defaultMaxPayload)
	c.MaxSignalsPerRun = orDefault(c.MaxSignalsPerRun, defaultMaxSignals)
	c.MaxSignalBytesPerRun = orDefault(c.MaxSignalBytesPerRun, defaultSignalBytes)
	c.Retention = orDefault(c.Retention, DefaultRetention)
	c.VersionWaitAlert = orDefault(c.VersionWaitAlert, DefaultVersionWaitAlert)
	if c.Observer == nil {
		c.Observer = NopObserver{}
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	switch {
	case c.LeaseDuration < time.Second:
		return c, fmt.Errorf("pgdurable: LeaseDuration %s is below the 1s minimum", c.LeaseDuration)
	case c.HeartbeatInterval < 0 || c.SweepInterval < 0 || c.MaxInlineBackoff < 0:
		return c, fmt.Errorf("pgdurable: HeartbeatInterval (%s), SweepInterval (%s) and MaxInlineBackoff (%s) cannot be negative",
			c.HeartbeatInterval, c.SweepInterval, c.MaxInlineBackoff)
	case c.HeartbeatInterval >= c.LeaseDuration:
		return c, fmt.Errorf("pgdurable: HeartbeatInterval %s must be shorter than LeaseDuration %s", c.HeartbeatInterval, c.LeaseDuration)
	case c.MaxWorkers < 0 || c.MaxDeliveries < 0 || c.MaxPayloadBytes < 0 || c.MaxSignalsPerRun < 0 || c.MaxSignalBytesPerRun < 0:
		return c, errors.New("pgdurable: MaxWorkers, MaxDeliveries, MaxPayloadBytes, MaxSignalsPerRun and MaxSignalBytesPerRun cannot be negative")
	case c.Retention > 0 && c.Retention < MinRetention:
		return c, fmt.Errorf("pgdurable: Retention %s is below the %s minimum (negative keeps finished runs for ever)", c.Retention, MinRetention)
	case c.MaxWorkers > MaxMaxWorkers:
		return c, fmt.Errorf("pgdurable: MaxWorkers %d is over %d, the most River works at once on a queue", c.MaxWorkers, MaxMaxWorkers)
	case c.RetryPolicy.validate() != nil:
		return c, fmt.Errorf("pgdurable: Config.%w", c.RetryPolicy.validate())
	}
	return c, nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Engine starts runs and, once started, delivers them to their workflow
// functions. One Engine per process; any number of processes may share a
// database. Safe for concurrent use.
type Engine struct {
	pool *pgxpool.Pool
	// afterBulkList, set only by tests, is called after a bulk cancel
	// lists the runs of each status.
	afterBulkList func(RunStatus)
	// replay, set only on the scratch engine of Replay, stops a delivery
	// where it would run a step's function.
	replay *replayProbe
	// unchained: runs whose tx steps' chain was lost under a step (see
	// unchainedRuns).
	unchained unchainedRuns
	// schema is where the engine's tables are (Config.Schema), and db the
	// pool bound to it: every statement runs on db or on a transaction
	// bound with on.
	schema *store.Schema
	db     store.DBTX
	cfg    Config
	log    *slog.Logger
	obs    Observer
	tr     tracing
	queue  *queue.Queue
	now    func() time.Time
	retry  RetryPolicy // cfg.RetryPolicy merged over DefaultRetryPolicy
	// processID names this process's row in engine_processes while it is
	// started (see ListWorkflows).
	processID uuid.UUID

	draining atomic.Bool // Stop was called: deliveries hand runs back at the next step
	stopping atomic.Bool // Stop or StopAndCancel was called: no more direct dispatch
	live     sync.Map    // run ID → *delivery of this process holding it
	// records commits the record writes of this process's deliveries,
	// many runs' in one statement (see groupcommit.Batcher).
	records *perRoute[*store.RecordWrite, groupcommit.Outcome[store.WriteResult]]
	// starts coalesces concurrent Start calls into multi-row inserts.
	starts *groupcommit.Batcher[store.NewRun, groupcommit.Outcome[*store.InsertedRun]]
	// claims coalesces the claims of concurrent deliveries.
	claims *perRoute[store.Fence, groupcommit.Outcome[store.ClaimResult]]
	// beats coalesces the heartbeats of concurrent deliveries.
	beats *perRoute[store.Beat, groupcommit.Outcome[store.BeatResult]]
	// slots holds one token per delivery running in this process, River's
	// and directly dispatched ones alike: at most MaxWorkers.
	slots chan struct{}
	// dispatchCtx is the context of directly dispatched deliveries (see
	// dispatch), cancelled by StopAndCancel; dispatched tracks them.
	dispatchCtx    context.Context
	cancelDispatch context.CancelCauseFunc
	dispatched     sync.WaitGroup
	// held are runs started here while every worker was busy (see
	// holdLocal); heldMu also orders dispatched.Add before stopping.
	heldMu sync.Mutex
	held   []heldRun
	// overdue, armed while runs are held, hands those held too long to
	// River (see releaseOverdue).
	overdue *time.Timer
	// deliveryTime is how long this process's deliveries take, on
	// average: it bounds how many runs are worth holding (see maxHeld).
	deliveryTime movingAverage
	// ends wakes Wait calls on runs that end in this process: run ID →
	// channels closed when its end commits.
	endsMu sync.Mutex
	ends   map[uuid.UUID][]chan struct{}
	// remote hears of ends committed by other processes (see Wait).
	remote remoteEnds

	mu sync.Mutex
	// workflows is the latest registered version of each workflow, which
	// starts by name take; versions every registered version, which
	// deliveries are routed by.
	workflows map[string]registered
	versions  map[workflowKey]registered
	warned    map[string]time.Time // warning key → when last logged (warnOnce)
	started   bool
	// flowQueues are the queues this process serves (RegisterQueue);
	// stopAdmitting ends their admitters.
	flowQueues    map[string]*flowQueue
	stopAdmitting context.CancelFunc
	// rateLimits are the rate limits this process registers
	// (RegisterRateLimit).
	rateLimits map[string]Rate
	// maint runs the sweep and the other background jobs while the
	// engine is started; process is the one of them that Start and stop
	// also call.
	maint   *maintenance.Maintainer
	process *maintenance.ProcessRegistry
}

// New builds an Engine over pool, which must point at a database migrated
// with storage/migrations. It validates cfg and never touches the schema.
// Register workflows, then call Start to work runs; an Engine that is never
// started can still start and inspect runs.
func New(pool *pgxpool.Pool, cfg *Config) (*Engine, error) {
	if pool == nil {
		return nil, errors.New("pgdurable: New needs a non-nil pool")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	schema, err := store.NewSchema(c.Schema)
	if err != nil {
		return nil, fmt.Errorf("pgdurable: %w", err)
	}
	e := &Engine{
		pool:      pool,
		schema:    schema,
		db:        schema.On(pool),
		cfg:       c,
		log:       c.Logger,
		obs:       guardedObserver{o: c.Observer, log: c.Logger},
		tr:        newTracing(c.TracerProvider, c.Propagator),
		now:       c.Clock.Now,
		workflows: map[string]registered{},
		versions:  map[workflowKey]registered{},
		processID: uuid.New(),
	}
	for name, opts := range c.Queues {
		if err := e.RegisterQueue(name, opts); err != nil {
			return nil, err
		}
	}
	for name, r := range c.RateLimits {
		if err := e.RegisterRateLimit(name, r); err != nil {
			return nil, err
		}
	}
	e.retry = (RetryPolicy{}).merge(c.RetryPolicy, &DefaultRetryPolicy)
	e.records = newRecordWriter(e)
	e.starts = newStartBatcher(e)
	e.claims = newClaimBatcher(e)
	e.beats = newBeatBatcher(e)
	e.slots = make(chan struct{}, c.MaxWorkers)
	e.dispatchCtx, e.cancelDispatch = context.WithCancelCause(context.Background())
	e.queue, err = queue.New(pool, queue.Config{
		Schema:            c.Schema,
		Queue:             c.Queue,
		MaxWorkers:        c.MaxWorkers,
		FetchCooldown:     c.FetchCooldown,
		FetchPollInterval: c.FetchPollInterval,
		Logger:            riverLogger(c.Logger),
	}, e.deliver)
	if err != nil {
		return nil, fmt.Errorf("pgdurable: %w", err)
	}
	return e, nil
}

// Schema is the PostgreSQL schema of the engine's tables (Config.Schema,
// DefaultSchema when it was empty), for tools that read them beside the
// engine.
func (e *Engine) Schema() string { return e.cfg.Schema }

// on binds q (a transaction of the engine's pool, or one a caller passed
// in) to the engine's schema, for the store's statements, like e.db: what
// the store learned of the server through e.db holds for it too.
func (e *Engine) on(q store.Querier) store.DBTX { return store.Bind(e.db, q) }

// txn runs fn in a transaction on the engine's pool and commits it: on
// Citus in two phases when it wrote the coordinator's tables as well as a
// worker node's (River's tickets with runs; see store.TwoPhase), so that
// neither part commits alone.
func (e *Engine) txn(ctx context.Context, fn func(pgx.Tx) error) error {
	return store.InTx(ctx, e.on(e.pool), fn)
}

// riverLogger passes on River's warnings and errors only: its info logs
// repeat what the engine logs with run context.
func riverLogger(l *slog.Logger) *slog.Logger {
	return slog.New(levelFilter{l.Handler(), slog.LevelWarn}).With("component", "river")
}

// levelFilter drops records below min, and River's stuck-job warnings: a
// delivery legitimately runs longer than River's job timeout, which only
// times River's rescue of tickets whose process died before the claim.
type levelFilter struct {
	slog.Handler
	min slog.Level
}

func (f levelFilter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= f.min && f.Handler.Enabled(ctx, l)
}

func (f levelFilter) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "Job appears to be stuck") || strings.Contains(r.Message, "Job became unstuck") {
		return nil
	}
	return f.Handler.Handle(ctx, r)
}

func (f levelFilter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return levelFilter{f.Handler.WithAttrs(attrs), f.min}
}

func (f levelFilter) WithGroup(name string) slog.Handler {
	return levelFilter{f.Handler.WithGroup(name), f.min}
}

// Register adds workflows built with Define, and the queues and rate
// limits they use (DefineQueue, DefineRateLimit, registered as
// RegisterQueue and RegisterRateLimit do: before Start), before Start. A
// workflow may be registered under several versions
// (WorkflowOpts.Version), side by side: a run stays on the version it
// started with, and this process works only the runs of the versions it
// registers, handing the others back for a process that does (as it does
// the runs of a workflow it does not register at all). Starts by name
// (StartJSON, the HTTP API, the CLI, schedules, signal-with-start) take
// the latest version registered here; Workflow.Start takes its own. A
// name and version registered twice is an error, as is a queue
// registered twice (a rate limit registered again is redefined); the
// registrations before the one that failed stay registered.
func (e *Engine) Register(regs ...Registration) error {
	for _, r := range regs {
		if err := r.register(e); err != nil {
			return err
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for key, r := range e.versions {
		if latest := e.workflows[key.name]; r.autoUpgrade && latest.version != r.version {
			e.log.Warn("WorkflowOpts.AutoUpgrade is set on a version that is not the latest registered: it has no effect; "+
				"set it on the latest", "workflow", r.name, "workflow_version", r.version, "latest_version", latest.version)
		}
	}
	return nil
}

// addWorkflow registers one version of a workflow (see Register).
func (e *Engine) addWorkflow(r registered) error {
	if r.err != nil {
		return r.err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	key := workflowKey{r.name, r.version}
	if _, dup := e.versions[key]; dup {
		return fmt.Errorf("pgdurable: workflow %q version %d registered twice", r.name, r.version)
	}
	e.versions[key] = r
	if latest, ok := e.workflows[r.name]; !ok || r.version > latest.version {
		e.workflows[r.name] = r
	}
	return nil
}

// workflowKey names one registered version of a workflow.
type workflowKey struct {
	name    string
	version int
}

// workflow is the latest version of name registered here.
func (e *Engine) workflow(name string) (registered, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.workflows[name]
	return r, ok
}

// deliveryVersion is the registered version a delivery of a run of name,
// version runs: that version, or the latest registered one when that one
// is newer and opts in to WorkflowOpts.AutoUpgrade (upgrade reports it).
func (e *Engine) deliveryVersion(name string, version int) (wf registered, upgrade, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if latest, ok := e.workflows[name]; ok && latest.autoUpgrade && latest.version > version {
		return latest, true, true
	}
	wf, ok = e.versions[workflowKey{name, version}]
	return wf, false, ok
}

// minPoolConns is the pool size below which Start warns: River holds one
// connection for LISTEN and deliveries starve on the rest.
const minPoolConns = 8

// Start begins working runs: River fetches deliveries and the sweeper runs
// every Config.SweepInterval. Runs that wait for a process of a version it
// registers (Run.WaitingFor) get a new delivery ticket at once. ctx bounds startup only; stop with Stop or
// StopAndCancel.
func (e *Engine) Start(ctx context.Context) error {
	if n := e.pool.Config().MaxConns; n < minPoolConns {
		e.log.Warn("pgx pool is small for a worker; set pool_max_conns", "max_conns", n, "max_workers", e.cfg.MaxWorkers, "recommended_min", minPoolConns)
	}
	e.mu.Lock()
	if e.started {
		e.mu.Unlock()
		return errors.New("pgdurable: engine already started")
	}
	e.started = true
	e.mu.Unlock()
	// migrate up refuses to change the routes while an engine process is
	// registered, and this one reads them once: no migration may run
	// between the reading and the registering (a migration under way is
	// waited for).
	release, err := migrations.HoldOffMigrations(ctx, e.pool)
	if err == nil {
		defer release()
		_, err = store.Routes(ctx, e.db)
	}
	if err == nil {
		_, err = store.OnCitus(ctx, e.db)
	}
	if err != nil {
		e.mu.Lock()
		e.started = false
		e.mu.Unlock()
		return fmt.Errorf("pgdurable: %w", err)
	}
	// The definitions first: a process that cannot write them works
	// nothing rather than admit by another process's limits.
	e.serveWorkflowQueues()
	if err := e.defineFlow(ctx); err != nil {
		e.mu.Lock()
		e.started = false
		e.mu.Unlock()
		return fmt.Errorf("pgdurable: defining queues and rate limits: %w", err)
	}
	if err := e.queue.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("pgdurable: starting workers: %w", err)
	}
	e.maint, e.process = e.maintainer()
	e.process.RunOnce(ctx)
	e.wakeVersionWaits(ctx)
	e.maint.Start(ctx)
	admitting, stop := context.WithCancel(context.Background())
	e.mu.Lock()
	e.stopAdmitting = stop
	e.mu.Unlock()
	e.startQueues(admitting)
	return nil
}

// maxWokenVersionWaits bounds the runs a starting process wakes (see
// wakeVersionWaits); the others come back with their own tickets, within
// 30 s.
const maxWokenVersionWaits = 10_000

// wakeVersionWaits gives the runs waiting for a process of a version this
// one registers (or moves up, WorkflowOpts.AutoUpgrade) a ticket due now:
// their own tickets, handed back by processes of other versions, are
// snoozed for up to 30 s. A failure is logged: those tickets still come.
func (e *Engine) wakeVersionWaits(ctx context.Context) {
	e.mu.Lock()
	var vs []store.RunVersions
	for _, w := range e.versions {
		vs = append(vs, store.RunVersions{Name: w.name, Version: w.version})
	}
	for _, w := range e.workflows {
		if w.autoUpgrade {
			vs = append(vs, store.RunVersions{Name: w.name, Version: w.version, Below: w.version})
		}
	}
	e.mu.Unlock()
	if len(vs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	var woken []uuid.UUID
	err := e.inTx(ctx, nil, func(tx pgx.Tx) error {
		var err error
		if woken, err = store.WakeVersionWaits(ctx, e.on(tx), store.WakeParams{Queue: e.cfg.Queue, Versions: vs, Now: e.now(), Limit: maxWokenVersionWaits}); err != nil {
			return err
		}
		return e.queue.EnqueueMany(ctx, tx, woken)
	})
	switch {
	case err != nil:
		e.log.Warn("waking the runs that wait for this process's versions failed; their own tickets bring them within 30 s", "error", err)
	case len(woken) > 0:
		e.log.Info("woke the runs that waited for a process of their workflow version", "runs", len(woken))
	}
}

// maintainer builds the services of the engine's background jobs: at
// every sweep (Config.SweepInterval on average, with jitter so several
// engines do not sweep in lockstep) the lease sweep, the schedules due,
// the cancellations requested elsewhere; every 10 s the process registry;
// about once a minute the retention prune (none when Retention is
// negative); every min(LeaseDuration/2, 5 s) the orphaned tickets. Every
// engine sweeps, not only River's leader: a dead leader would delay crash
// recovery by River's leader TTL, and SKIP LOCKED keeps concurrent sweeps
// off each other's rows.
func (e *Engine) maintainer() (*maintenance.Maintainer, *maintenance.ProcessRegistry) {
	process := &maintenance.ProcessRegistry{DB: e.db, Log: e.log, ID: e.processID, QueueName: e.cfg.Queue,
		WriteTimeout: writeTimeout, Workflows: func() []store.ProcessWorkflow {
			e.mu.Lock()
			defer e.mu.Unlock()
			var wfs []store.ProcessWorkflow
			for _, w := range e.versions {
				auto := w.autoUpgrade && e.workflows[w.name].version == w.version
				wfs = append(wfs, store.ProcessWorkflow{Name: w.name, Version: w.version, AutoUpgrade: auto})
			}
			return wfs
		},
		Queues: func() []store.ProcessQueue {
			e.mu.Lock()
			defer e.mu.Unlock()
			var qs []store.ProcessQueue
			for name, q := range e.flowQueues {
				qs = append(qs, store.ProcessQueue{Name: name, Workers: q.opts.Workers})
			}
			return qs
		}}
	services := []maintenance.Service{
		&maintenance.LeaseSweeper{DB: e.db, Queue: e.queue, Log: e.log, QueueName: e.cfg.Queue,
			Lease: e.cfg.LeaseDuration, Now: e.now, Cancelled: e.noteCancelled},
		&maintenance.Scheduler{DB: e.db, Log: e.log, QueueName: e.cfg.Queue, Now: e.now,
			Workflow: e.scheduleStarter, Fired: func(schedule, workflow, outcome, reason string) {
				e.obs.ScheduleFired(ScheduleFiredEvent{Schedule: schedule, Workflow: workflow, Outcome: outcome, Reason: reason})
			}},
		&maintenance.CancelPoller{DB: e.db, Log: e.log, Live: e.liveRuns, Cancelled: e.noteCancelled},
		process,
	}
	if e.cfg.Retention > 0 {
		services = append(services, &maintenance.Pruner{Log: e.log, Retention: e.cfg.Retention, Now: e.now,
			Batch: e.pruneBatch})
	}
	services = append(services, &maintenance.OrphanSweeper{DB: e.db, Queue: e.queue, Log: e.log,
		Lease: e.cfg.LeaseDuration})
	return &maintenance.Maintainer{Interval: e.cfg.SweepInterval, Services: services}, process
}

// liveRuns yields this process's deliveries, for the CancelPoller.
func (e *Engine) liveRuns(yield func(maintenance.LiveRun) bool) {
	e.live.Range(func(k, v any) bool {
		d := v.(*delivery)
		return yield(maintenance.LiveRun{RunID: k.(uuid.UUID), ClaimedAt: d.claimedAt, CancelHeard: d.cancelRequested.Load()})
	})
}

// scheduleStarter is the Scheduler's way to start runs of workflow for
// schedule's fires; false when this process does not register workflow.
func (e *Engine) scheduleStarter(workflow, schedule string) (maintenance.StartFunc, bool) {
	r, ok := e.workflow(workflow)
	if !ok {
		return nil, false
	}
	return func(ctx context.Context, tx pgx.Tx, input []byte, workflowID string) (uuid.UUID, error) {
		res, err := e.startJSON(ctx, tx, workflow, r.version, input, &StartOpts{WorkflowID: workflowID, schedule: schedule})
		if err != nil {
			return uuid.Nil, err
		}
		return res.RunID, nil
	}, true
}

// Stop stops fetching new deliveries and waits, until ctx is done, for
// running deliveries to reach their next step boundary: a running step
// finishes and is recorded, then the run is handed back (pending, with a
// new delivery enqueued) for another worker instead of waiting for its
// lease to expire. Use StopAndCancel when steps must not finish.
func (e *Engine) Stop(ctx context.Context) error {
	e.setStopping()
	e.draining.Store(true)
	return e.stop(ctx, e.queue.Stop)
}

// StopAndCancel cancels running deliveries' contexts, hands their runs back
// (released for another worker at once, not after the lease expires; a
// step that still answers while its lease holds is recorded first) and
// returns once they have, or when ctx is done.
func (e *Engine) StopAndCancel(ctx context.Context) error {
	e.setStopping()
	e.cancelDispatch(errStopAndCancel)
	return e.stop(ctx, e.queue.StopAndCancel)
}

// errStopAndCancel is the cause a StopAndCancel gives the contexts of
// deliveries it cancels.
var errStopAndCancel = errors.New("pgdurable: StopAndCancel called")

func (e *Engine) stop(ctx context.Context, stopQueue func(context.Context) error) error {
	e.mu.Lock()
	started := e.started
	e.mu.Unlock()
	if !started {
		return nil
	}
	e.mu.Lock()
	if e.stopAdmitting != nil {
		e.stopAdmitting()
	}
	e.mu.Unlock()
	err := stopQueue(ctx)
	// After River stopped fetching: released here, a held run would be
	// fetched by this very process and handed back again.
	e.releaseHeld(ctx)
	if werr := e.waitDispatched(ctx); err == nil {
		err = werr
	}
	e.maint.Stop()
	e.process.Forget()
	if err != nil {
		return fmt.Errorf("pgdurable: stopping workers: %w", err)
	}
	return nil
}

// watchEnd returns a channel closed when runID ends in this process, and a
// function that stops watching.
func (e *Engine) watchEnd(runID uuid.UUID) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	e.endsMu.Lock()
	if e.ends == nil {
		e.ends = map[uuid.UUID][]chan struct{}{}
	}
	e.ends[runID] = append(e.ends[runID], ch)
	e.endsMu.Unlock()
	return ch, func() {
		e.endsMu.Lock()
		defer e.endsMu.Unlock()
		list := e.ends[runID]
		for i, c := range list {
			if c == ch {
				list = append(list[:i:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(e.ends, runID)
		} else {
			e.ends[runID] = list
		}
	}
}

// notifyEnded wakes the Wait calls watching runID.
func (e *Engine) notifyEnded(runID uuid.UUID) {
	e.endsMu.Lock()
	list := e.ends[runID]
	delete(e.ends, runID)
	e.endsMu.Unlock()
	for _, ch := range list {
		close(ch)
	}
}

// setStopping ends direct dispatch and the starting of held runs.
func (e *Engine) setStopping() {
	e.heldMu.Lock()
	e.stopping.Store(true)
	e.heldMu.Unlock()
}

// waitDispatched waits for directly dispatched deliveries to end, or for
// ctx, as River's Stop waits for its own.
func (e *Engine) waitDispatched(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		e.dispatched.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// WorkflowInfo is a workflow that live engine processes register, as
// ListWorkflows reports it.
type WorkflowInfo struct {
	Name      string        `json:"name"`
	Versions  []int         `json:"versions"` // the versions the processes register, ascending
	Processes []ProcessInfo `json:"processes"`
}

// ProcessInfo is an engine process that registers a workflow.
type ProcessInfo struct {
	ID         uuid.UUID `json:"id"`
	Hostname   string    `json:"hostname"`
	PID        int       `json:"pid"`
	Queue      string    `json:"queue"`
	Version    int       `json:"version"` // of the workflow, as this process registers it
	StartedAt  time.Time `json:"started_at"`
	LastSeenAt time.Time `json:"last_seen_at"`
}

// ListWorkflows returns the workflows that live engine processes register
// (started engines seen in the last 30 s, on any queue), by name, with the
// versions and the processes (host, pid, queue) that register each: what
// can run where. A process records itself when its engine starts and
// every 10 s after, and deletes its record when it stops; a killed one
// drops out of the list 30 s after it was last seen.
func (e *Engine) ListWorkflows(ctx context.Context) ([]WorkflowInfo, error) {
	procs, err := store.LiveProcesses(ctx, e.db, maintenance.ProcessLive)
	if err != nil {
		return nil, fmt.Errorf("pgdurable: %w", err)
	}
	byName := map[string]*WorkflowInfo{}
	for _, p := range procs {
		for _, w := range p.Workflows {
			info := byName[w.Name]
			if info == nil {
				info = &WorkflowInfo{Name: w.Name}
				byName[w.Name] = info
			}
			if !slices.Contains(info.Versions, w.Version) {
				info.Versions = append(info.Versions, w.Version)
			}
			info.Processes = append(info.Processes, ProcessInfo{ID: p.ID, Hostname: p.Hostname, PID: p.PID, Queue: p.Queue,
				Version: w.Version, StartedAt: p.StartedAt, LastSeenAt: p.LastSeenAt})
		}
	}
	out := make([]WorkflowInfo, 0, len(byName))
	for _, info := range byName {
		slices.Sort(info.Versions)
		out = append(out, *info)
	}
	slices.SortFunc(out, func(a, b WorkflowInfo) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}
