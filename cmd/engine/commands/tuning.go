package commands

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgdurable/pgdurable/engine"
)

// The environment variables serve and dev read for the engine settings
// their flags also take (a flag wins over its variable).
const (
	envRetention     = "ENGINE_RETENTION"
	envLease         = "ENGINE_LEASE_DURATION"
	envHeartbeat     = "ENGINE_HEARTBEAT_INTERVAL"
	envMaxWorkers    = "ENGINE_MAX_WORKERS"
	envMaxDeliveries = "ENGINE_MAX_DELIVERIES"
	envVersionWait   = "ENGINE_VERSION_WAIT_ALERT"
)

// tuning holds the engine settings of serve's and dev's flags, their
// defaults being Options.Config's values (else the engine's).
type tuning struct {
	retention     time.Duration // negative: for ever
	lease         time.Duration
	heartbeat     time.Duration // 0: a third of the lease
	maxWorkers    int
	maxDeliveries int
	versionWait   time.Duration // negative: never
}

// baseConfig is a copy of Options.Config (zero when nil) without the
// fields the commands set themselves.
func (g *global) baseConfig() engine.Config {
	var cfg engine.Config
	if g.opts.Config != nil {
		cfg = *g.opts.Config
	}
	cfg.Logger, cfg.Observer, cfg.TracerProvider = nil, nil, nil
	cfg.Schema = g.schema()
	return cfg
}

// addTuningFlags adds the engine-setting flags to serve or dev, their
// defaults shown as Options.Config sets them, else as the engine does.
func (g *global) addTuningFlags(cmd *cobra.Command, t *tuning) {
	base := g.baseConfig()
	t.retention = base.Retention
	if t.retention == 0 {
		t.retention = engine.DefaultRetention
	}
	t.lease = cmp0(base.LeaseDuration, engine.DefaultLeaseDuration)
	t.heartbeat = base.HeartbeatInterval
	t.maxWorkers = cmp0(base.MaxWorkers, engine.DefaultMaxWorkers)
	t.maxDeliveries = cmp0(base.MaxDeliveries, engine.DefaultMaxDeliveries)
	t.versionWait = cmp0(base.VersionWaitAlert, engine.DefaultVersionWaitAlert)
	fs := cmd.Flags()
	fs.Var((*retentionValue)(&t.retention), "retention",
		`keep finished runs this long, then the engines delete them: 720h, or "forever" (env `+envRetention+")")
	fs.DurationVar(&t.lease, "lease-duration", t.lease,
		"a crashed worker's runs continue elsewhere about this long after its last write; at least 1s (env "+envLease+")")
	heartbeatHelp := "how often a running delivery renews its lease; below --lease-duration (env " + envHeartbeat + ")"
	if t.heartbeat == 0 {
		heartbeatHelp += " (default a third of --lease-duration)"
	}
	fs.DurationVar(&t.heartbeat, "heartbeat-interval", t.heartbeat, heartbeatHelp)
	fs.IntVar(&t.maxWorkers, "max-workers", t.maxWorkers, "runs this process works at once (env "+envMaxWorkers+")")
	fs.IntVar(&t.maxDeliveries, "max-deliveries", t.maxDeliveries,
		"deliveries in a row that die within a lease (crashes) before a run is parked as crash_loop (env "+envMaxDeliveries+")")
	fs.DurationVar(&t.versionWait, "version-wait-alert", t.versionWait,
		"log an error, and count the run as overdue in the metrics, once a run has waited this long for a process that registers its workflow version; negative never (env "+envVersionWait+")")
}

func cmp0[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// retentionValue is --retention: a duration above 0, or "forever"
// (stored as -1, engine.Config.Retention's "keep for ever").
type retentionValue time.Duration

func (r *retentionValue) String() string {
	if *r < 0 {
		return "forever"
	}
	return time.Duration(*r).String()
}

func (r *retentionValue) Set(s string) error {
	d, err := parseRetention(s)
	if err != nil {
		return err
	}
	*r = retentionValue(d)
	return nil
}

func (r *retentionValue) Type() string { return "duration" }

// parseRetention reads a retention: a Go duration above 0, or "forever"
// (-1).
func parseRetention(s string) (time.Duration, error) {
	if strings.EqualFold(strings.TrimSpace(s), "forever") {
		return -1, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q is neither a duration above 0 (720h, 168h30m) nor \"forever\"", s)
	}
	if d < engine.MinRetention {
		return 0, fmt.Errorf("%s is below the %s minimum (or \"forever\")", d, engine.MinRetention)
	}
	return d, nil
}

// engineConfig resolves serve's engine configuration: each tuned field
// from its flag if given, else its environment variable if set, else
// Options.Config, else the engine's default; and checks the values
// together, naming where each came from. A bad value is a usage error.
func (g *global) engineConfig(fs *pflag.FlagSet, t *tuning) (engine.Config, error) {
	cfg := g.baseConfig()
	from := map[string]string{} // where the lease and the heartbeat came from
	// source says where a setting comes from: its flag (the bound
	// variable holds the value), else its variable (returned as set).
	source := func(flag, env string) (where, envValue string, ok bool) {
		if fs.Changed(flag) {
			return "--" + flag, "", true
		}
		if v := g.opts.Getenv(env); v != "" {
			return env, v, true
		}
		return "", "", false
	}
	bad := func(where string, err error) error { return &usageError{fmt.Errorf("%s: %w", where, err)} }

	if where, env, ok := source("retention", envRetention); ok {
		d := t.retention
		if env != "" {
			var err error
			if d, err = parseRetention(env); err != nil {
				return cfg, bad(where, err)
			}
		}
		cfg.Retention = d
	}
	if where, env, ok := source("lease-duration", envLease); ok {
		d := t.lease
		if env != "" {
			var err error
			if d, err = time.ParseDuration(env); err != nil {
				return cfg, bad(where, fmt.Errorf("%q is not a duration such as 10s", env))
			}
		}
		if d < time.Second {
			return cfg, &usageError{fmt.Errorf("%s: the lease duration %s is below the 1s minimum", where, d)}
		}
		cfg.LeaseDuration, from["lease"] = d, where
	}
	if where, env, ok := source("heartbeat-interval", envHeartbeat); ok {
		d := t.heartbeat
		if env != "" {
			var err error
			if d, err = time.ParseDuration(env); err != nil {
				return cfg, bad(where, fmt.Errorf("%q is not a duration such as 3s", env))
			}
		}
		if d <= 0 {
			return cfg, &usageError{fmt.Errorf("%s: the heartbeat interval must be above 0, not %s", where, d)}
		}
		cfg.HeartbeatInterval, from["heartbeat"] = d, where
	}
	if where, env, ok := source("version-wait-alert", envVersionWait); ok {
		d := t.versionWait
		if env != "" {
			var err error
			if d, err = time.ParseDuration(env); err != nil {
				return cfg, bad(where, fmt.Errorf("%q is not a duration such as 10m", env))
			}
		}
		if d == 0 {
			return cfg, &usageError{fmt.Errorf("%s: the version wait alert must be a duration above 0 (10m), or negative for never", where)}
		}
		cfg.VersionWaitAlert = d
	}
	for _, n := range []struct {
		flag, env, what string
		flagValue       int
		dst             *int
	}{
		{"max-workers", envMaxWorkers, "max workers", t.maxWorkers, &cfg.MaxWorkers},
		{"max-deliveries", envMaxDeliveries, "max deliveries", t.maxDeliveries, &cfg.MaxDeliveries},
	} {
		where, env, ok := source(n.flag, n.env)
		if !ok {
			continue
		}
		v := n.flagValue
		if env != "" {
			var err error
			if v, err = strconv.Atoi(env); err != nil {
				return cfg, bad(where, fmt.Errorf("%q is not a whole number", env))
			}
		}
		if v < 1 {
			return cfg, &usageError{fmt.Errorf("%s: %s must be at least 1, not %d", where, n.what, v)}
		}
		if n.flag == "max-workers" && v > engine.MaxMaxWorkers {
			return cfg, &usageError{fmt.Errorf("%s: %s must be at most %d (River's limit per queue), not %d", where, n.what, engine.MaxMaxWorkers, v)}
		}
		*n.dst = v
	}

	// The heartbeat against the lease, each as it will be.
	lease, leaseFrom := cfg.LeaseDuration, from["lease"]
	switch {
	case lease == 0:
		lease, leaseFrom = engine.DefaultLeaseDuration, "the default"
	case leaseFrom == "":
		leaseFrom = "Options.Config"
	}
	if cfg.HeartbeatInterval != 0 && cfg.HeartbeatInterval >= lease {
		hbFrom := from["heartbeat"]
		if hbFrom == "" {
			hbFrom = "Options.Config"
		}
		return cfg, &usageError{fmt.Errorf("the heartbeat interval %s (%s) must be below the lease duration %s (%s): "+
			"a delivery renews its lease once per heartbeat, so the lease would lapse between renewals",
			cfg.HeartbeatInterval, hbFrom, lease, leaseFrom)}
	}
	if cfg.Retention == 0 {
		cfg.Retention = engine.DefaultRetention
	}
	return cfg, nil
}

// retention is the retention serve resolves without flags, and where it
// comes from: ENGINE_RETENTION, else Options.Config.Retention, else
// engine.DefaultRetention (negative: for ever). A bad ENGINE_RETENTION is
// a usage error.
func (g *global) retention() (time.Duration, string, error) {
	if v := g.opts.Getenv(envRetention); v != "" {
		d, err := parseRetention(v)
		if err != nil {
			return 0, "", &usageError{fmt.Errorf("%s: %w", envRetention, err)}
		}
		return d, envRetention, nil
	}
	if d := g.baseConfig().Retention; d != 0 {
		return d, "this binary's Options.Config", nil
	}
	return engine.DefaultRetention, "the engine's default", nil
}
