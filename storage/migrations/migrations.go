// Package migrations holds pgdurable's schema: embedded goose v3 migrations
// (the only source of the schema) and River's own migrations, applied
// together by [Migrate].
//
// Migrate never runs implicitly: engine.New does not touch the schema. Run it
// from a deploy step or at program start-up; enginetest runs it for tests.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

//go:embed *.sql
var files embed.FS

// FS returns the embedded migration files (`NNNNN_name.sql` with
// `-- +goose Up` and `-- +goose Down` sections), for tools that read the
// schema, such as sqlc or a hash of the schema in tests.
func FS() fs.FS { return files }

// Direction says which way [Migrate] moves the schema.
type Direction string

const (
	// Up applies River's migrations, then every pending pgdurable migration.
	Up Direction = "up"
	// Down rolls back pgdurable's migrations (all of them, or Opts.Steps),
	// and River's too when Opts.IncludeRiver is set.
	Down Direction = "down"
)

// Opts tunes [Migrate]. A nil *Opts uses the defaults.
type Opts struct {
	// Steps limits a Down migration to this many pgdurable versions.
	// 0 means all of them. Ignored for Up.
	Steps int
	// IncludeRiver makes Down also remove River's tables once every
	// pgdurable migration is rolled back. Off by default because other
	// River users may share the schema.
	IncludeRiver bool
}

// Result lists what one [Migrate] call changed. Both slices are empty when
// nothing was pending, which makes Migrate(Up) idempotent.
type Result struct {
	// Applied holds pgdurable migration versions applied (Up) or rolled back
	// (Down), in the order they ran.
	Applied []int64
	// River holds River migration versions applied or rolled back.
	River []int
}

// Migrate moves the schema of the database behind pool in direction.
//
// Concurrent callers are safe: goose serialises on a Postgres session
// advisory lock and River's migrator runs in one transaction. Errors name the
// failing migration.
func Migrate(ctx context.Context, pool *pgxpool.Pool, direction Direction, opts *Opts) (*Result, error) {
	if opts == nil {
		opts = &Opts{}
	}
	res := &Result{}
	river, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return nil, fmt.Errorf("creating river migrator: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := newProvider(db)
	if err != nil {
		return nil, err
	}

	switch direction {
	case Up:
		rr, err := river.Migrate(ctx, rivermigrate.DirectionUp, nil)
		if err != nil {
			return nil, fmt.Errorf("applying river migrations: %w", err)
		}
		for _, v := range rr.Versions {
			res.River = append(res.River, v.Version)
		}
		applied, err := provider.Up(ctx)
		if err != nil {
			return nil, fmt.Errorf("applying pgdurable migrations: %w", err)
		}
		for _, r := range applied {
			res.Applied = append(res.Applied, r.Source.Version)
		}
	case Down:
		for i := 0; opts.Steps == 0 || i < opts.Steps; i++ {
			r, err := provider.Down(ctx)
			if errors.Is(err, goose.ErrNoNextVersion) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("rolling back pgdurable migrations: %w", err)
			}
			res.Applied = append(res.Applied, r.Source.Version)
		}
		if opts.IncludeRiver {
			current, err := provider.GetDBVersion(ctx)
			if err != nil {
				return nil, fmt.Errorf("reading pgdurable schema version: %w", err)
			}
			if current != 0 {
				return res, fmt.Errorf("keeping river's tables: pgdurable schema is still at version %d", current)
			}
			rr, err := river.Migrate(ctx, rivermigrate.DirectionDown, &rivermigrate.MigrateOpts{TargetVersion: -1})
			if err != nil {
				return nil, fmt.Errorf("rolling back river migrations: %w", err)
			}
			for _, v := range rr.Versions {
				res.River = append(res.River, v.Version)
			}
		}
	default:
		return nil, fmt.Errorf("unknown migration direction %q (want %q or %q)", direction, Up, Down)
	}
	return res, nil
}

// Status reports each pgdurable migration and whether it is applied, plus
// River's applied versions.
type Status struct {
	Migrations   []MigrationStatus
	RiverVersion int // highest applied River migration, 0 when none
}

// MigrationStatus is one pgdurable migration's state.
type MigrationStatus struct {
	Version int64
	Name    string
	Applied bool
}

// GetStatus reads the schema state without changing it.
func GetStatus(ctx context.Context, pool *pgxpool.Pool) (*Status, error) {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := newProvider(db)
	if err != nil {
		return nil, err
	}
	st, err := provider.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading pgdurable migration status: %w", err)
	}
	out := &Status{}
	for _, s := range st {
		out.Migrations = append(out.Migrations, MigrationStatus{
			Version: s.Source.Version,
			Name:    s.Source.Path,
			Applied: s.State == goose.StateApplied,
		})
	}
	river, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return nil, fmt.Errorf("creating river migrator: %w", err)
	}
	versions, err := river.ExistingVersions(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading river migration status: %w", err)
	}
	for _, v := range versions {
		out.RiverVersion = max(out.RiverVersion, v.Version)
	}
	return out, nil
}

func newProvider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("creating migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithSessionLocker(locker),
		goose.WithTableName("pgdurable_schema_migrations"),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("loading pgdurable migrations: %w", err)
	}
	return p, nil
}
