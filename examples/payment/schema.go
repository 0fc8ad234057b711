package payment

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrate applies the example's own migrations (inventory, reservations,
// ledger), tracked in payment_schema_migrations, and adds the Catalog's
// SKUs that are missing. Idempotent.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return err
	}
	sub, err := fsSub()
	if err != nil {
		return err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub, goose.WithSessionLocker(locker),
		goose.WithTableName("payment_schema_migrations"), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("loading payment migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("applying payment migrations: %w", err)
	}
	// Seed data: the catalog's SKUs, added once, never reset here.
	for sku, stock := range Catalog {
		if _, err := pool.Exec(ctx, `INSERT INTO payment_inventory (sku, stock) VALUES ($1, $2) ON CONFLICT (sku) DO NOTHING`, sku, stock); err != nil {
			return fmt.Errorf("seeding inventory: %w", err)
		}
	}
	return nil
}

// Catalog is the seed inventory: SKU → stock.
var Catalog = map[string]int{
	"sku_tee": 100000, "sku_mug": 100000, "sku_cap": 100000, "sku_poster": 100000, "sku_sticker": 100000,
	"sku_limited": 3, // sells out during the demo
}

// Seed resets the inventory to Catalog: full stock, no reservations (the
// demo starts from it).
func Seed(ctx context.Context, pool *pgxpool.Pool) error {
	for sku, stock := range Catalog {
		if _, err := pool.Exec(ctx, `INSERT INTO payment_inventory (sku, stock) VALUES ($1, $2)
			ON CONFLICT (sku) DO UPDATE SET stock = excluded.stock, reserved = 0`, sku, stock); err != nil {
			return fmt.Errorf("seeding inventory: %w", err)
		}
	}
	_, err := pool.Exec(ctx, `DELETE FROM payment_reservations`)
	return err
}
