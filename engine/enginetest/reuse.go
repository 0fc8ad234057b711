package enginetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvReuse names the variable that, set to 1, lets a test binary reuse
// the databases of its finished tests: a test's database, instead of
// being dropped when the test ends, is emptied back to the template's
// state, renamed (so that a process the test left running cannot reach
// it, as it could not reach a dropped one) and handed to the binary's
// next test. Making a database from the
// template is most of what a short test costs on a Citus cluster (a
// CREATE DATABASE and a DROP DATABASE on every node, and a cold start
// of each node's caches for it); emptying one is a TRUNCATE.
//
// The databases left when the binary exits are not dropped (a test
// binary has no hook at its end), so only a server that goes away
// after the tests may be told to reuse: the throwaway servers of
// withpg and withcluster set it. A database a test changed beyond its
// rows and the objects it made is never reused (see reset).
const EnvReuse = "PGDURABLE_TEST_REUSE"

// testSchema holds, in the template and so in every test database,
// what reset needs: the tables the template has rows in (seeds, with a
// digest of their rows), the other tables (emptied), the sequences'
// states, the template's own objects (objects), a log of the objects
// DDL made, changed or dropped in the database since it was cloned (ddl,
// filled by event triggers), and the reset function itself.
const testSchema = "pgdurable_enginetest"

// reuseVersion is part of the template's name: a template made before
// testSchema changed is not used.
const reuseVersion = "enginetest reuse 2"

// idle holds the databases of this binary's finished tests that reset
// emptied, ready for its next ones.
var idle struct {
	sync.Mutex
	names []string
}

func reuseEnabled() bool { return os.Getenv(EnvReuse) == "1" }

func takeIdle() (string, bool) {
	idle.Lock()
	defer idle.Unlock()
	if len(idle.names) == 0 {
		return "", false
	}
	name := idle.names[len(idle.names)-1]
	idle.names = idle.names[:len(idle.names)-1]
	return name, true
}

func putIdle(name string) {
	idle.Lock()
	defer idle.Unlock()
	idle.names = append(idle.names, name)
}

// errChanged is reset's answer for a database a test changed beyond its
// rows: it is dropped rather than reused.
var errChanged = errors.New("changed beyond its rows")

// reset empties the database at dbURL back to the template's state, for
// another test: it ends every session still connected to it (a child
// process of the test, an engine it did not stop), and then, in one
// statement, checks that the template's rows are as they were and that
// DDL touched none of the template's objects, drops the tables, indexes,
// triggers, functions and schemas the test made (the DDL log has them),
// truncates every other table, sets each sequence back and forgets the
// planner's statistics and the activity counters the test's rows left
// (so a test plans as on a fresh clone). It fails with errChanged for a
// database that is unlike a fresh clone in a way it does not undo (DDL
// on a template object or making another kind of object, a changed
// template row, a prepared transaction: Citus's two-phase commits that a
// killed process left open are recovered first), and with the error for
// one it could not empty.
func reset(ctx context.Context, dbURL string, citus bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`); err != nil {
		return err
	}
	if citus {
		if _, err := conn.Exec(ctx, `SELECT recover_prepared_transactions()`); err != nil {
			return err
		}
	}
	var prepared int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()`).Scan(&prepared); err != nil {
		return err
	}
	if prepared > 0 {
		return fmt.Errorf("%w: %d prepared transactions", errChanged, prepared)
	}
	if _, err := conn.Exec(ctx, `SET lock_timeout = '10s'`); err != nil {
		return err
	}
	var why *string
	if err := conn.QueryRow(ctx, `SELECT `+testSchema+`.reset()`).Scan(&why); err != nil {
		return err
	}
	if why != nil {
		return fmt.Errorf("%w: %s", errChanged, *why)
	}
	return nil
}

// prepareReuse adds testSchema to the template being built at buildURL,
// once migrated: the tables the template holds rows in are recorded
// with a digest of their rows, the others as the tables to empty, the
// sequences with their states; the event trigger that logs DDL is made
// last, so that none of this counts.
func prepareReuse(ctx context.Context, buildURL string) error {
	conn, err := pgx.Connect(ctx, buildURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var citus bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return err
	}
	// A Citus shard is a table on the node that holds it, which the
	// coordinator's catalog shows to no one but Citus: never name one.
	notShard := "true"
	if citus {
		notShard = "NOT pg_catalog.relation_is_a_known_shard(c.oid)"
	}
	stmts := []string{
		`CREATE SCHEMA ` + testSchema,
		// One row per object a DDL command made, changed or dropped
		// (objid NULL when the command named none).
		`CREATE TABLE ` + testSchema + `.ddl (n bigserial PRIMARY KEY, tag text NOT NULL, objid oid,
			object_type text, identity text)`,
		// The template's own objects (from FirstNormalObjectId up): a
		// test's DDL may make and drop objects of its own, not change these.
		`CREATE TABLE ` + testSchema + `.objects (objid oid PRIMARY KEY)`,
		`CREATE TABLE ` + testSchema + `.seeds (rel regclass PRIMARY KEY, digest text NOT NULL)`,
		`CREATE TABLE ` + testSchema + `.emptied (rel regclass PRIMARY KEY)`,
		`CREATE TABLE ` + testSchema + `.sequences (seq regclass PRIMARY KEY, last_value bigint NOT NULL, is_called bool NOT NULL)`,
		`CREATE FUNCTION ` + testSchema + `.digest(rel regclass) RETURNS text LANGUAGE plpgsql AS $$
		DECLARE d text;
		BEGIN
			EXECUTE format('SELECT coalesce(md5(string_agg(x::text, E''\n'' ORDER BY x::text)), '''') FROM %s x', rel) INTO d;
			RETURN d;
		END $$`,
		`DO $$
		DECLARE r record; n bigint; v bigint; called bool;
		BEGIN
			FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
				WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND ` + notShard + `
				  AND s.nspname NOT IN ('pg_catalog', 'information_schema', '` + testSchema + `')
				  AND s.nspname NOT LIKE 'pg\_%' AND s.nspname NOT LIKE 'citus%' AND s.nspname NOT LIKE 'columnar%'
				  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e')
			LOOP
				EXECUTE format('SELECT count(*) FROM %s', r.rel) INTO n;
				IF n > 0 THEN
					INSERT INTO ` + testSchema + `.seeds VALUES (r.rel, ` + testSchema + `.digest(r.rel));
				ELSE
					INSERT INTO ` + testSchema + `.emptied VALUES (r.rel);
				END IF;
			END LOOP;
			INSERT INTO ` + testSchema + `.objects
				SELECT oid FROM pg_class WHERE oid >= 16384 UNION SELECT oid FROM pg_proc WHERE oid >= 16384
				UNION SELECT oid FROM pg_type WHERE oid >= 16384 UNION SELECT oid FROM pg_namespace WHERE oid >= 16384
				UNION SELECT oid FROM pg_trigger WHERE oid >= 16384 UNION SELECT oid FROM pg_constraint WHERE oid >= 16384
				UNION SELECT oid FROM pg_attrdef WHERE oid >= 16384 UNION SELECT oid FROM pg_rewrite WHERE oid >= 16384
				UNION SELECT oid FROM pg_policy WHERE oid >= 16384 UNION SELECT oid FROM pg_event_trigger WHERE oid >= 16384;
			FOR r IN SELECT c.oid::regclass AS seq FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
				WHERE c.relkind = 'S' AND s.nspname NOT IN ('pg_catalog', 'information_schema', '` + testSchema + `')
				  AND s.nspname NOT LIKE 'pg\_%' AND s.nspname NOT LIKE 'citus%' AND s.nspname NOT LIKE 'columnar%'
				  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e')
			LOOP
				EXECUTE format('SELECT last_value, is_called FROM %s', r.seq) INTO v, called;
				INSERT INTO ` + testSchema + `.sequences VALUES (r.seq, v, called);
			END LOOP;
		END $$`,
		// One round trip for the whole reset; NULL when the database is
		// as the template was, else why it is not.
		`CREATE FUNCTION ` + testSchema + `.reset() RETURNS text LANGUAGE plpgsql AS $$
		DECLARE r record; tables text;
		BEGIN
			-- DDL on the template's objects, or that named none, is not
			-- undone: the database is dropped.
			SELECT tag, identity INTO r FROM ` + testSchema + `.ddl
				WHERE objid IS NULL OR objid IN (SELECT objid FROM ` + testSchema + `.objects) ORDER BY n LIMIT 1;
			IF FOUND THEN
				RETURN 'DDL ran on the template''s objects (' || r.tag || coalesce(' ' || r.identity, '') || ')';
			END IF;
			FOR r IN SELECT rel, digest FROM ` + testSchema + `.seeds LOOP
				IF ` + testSchema + `.digest(r.rel) IS DISTINCT FROM r.digest THEN
					RETURN 'the rows of ' || r.rel::text || ' changed';
				END IF;
			END LOOP;
			-- What the test made (and did not drop) goes; CASCADE takes
			-- what depends on it, which it made too. Kinds
			-- of object not known here to be safe to drop keep the
			-- database from reuse.
			SELECT tag, object_type, identity INTO r FROM ` + testSchema + `.ddl
				WHERE object_type NOT IN ('table', 'view', 'materialized view', 'sequence', 'index', 'schema',
					'function', 'procedure', 'type', 'trigger') ORDER BY n LIMIT 1;
			IF FOUND THEN
				RETURN 'DDL made a ' || r.object_type || ' (' || r.tag || ' ' || r.identity || ')';
			END IF;
			-- Owners before what they own (a table takes its key's index
			-- with it, which alone cannot be dropped), newest first.
			FOR r IN SELECT objid, object_type, identity FROM (SELECT DISTINCT ON (objid) objid, object_type, identity, n
				FROM ` + testSchema + `.ddl WHERE tag NOT LIKE 'DROP%' ORDER BY objid, n) made
				ORDER BY array_position(ARRAY['schema', 'view', 'materialized view', 'table', 'sequence', 'function',
					'procedure', 'type', 'trigger', 'index'], object_type), n DESC LOOP
				IF r.object_type = 'trigger' THEN
					-- "name on schema.table"
					EXECUTE format('DROP TRIGGER IF EXISTS %s ON %s CASCADE',
						split_part(r.identity, ' on ', 1), substr(r.identity, length(split_part(r.identity, ' on ', 1)) + 5));
				ELSE
					EXECUTE format('DROP %s IF EXISTS %s CASCADE', upper(r.object_type), r.identity);
				END IF;
			END LOOP;
			DELETE FROM ` + testSchema + `.ddl;
			SELECT string_agg(rel::text, ', ') INTO tables FROM ` + testSchema + `.emptied;
			IF tables IS NOT NULL THEN
				EXECUTE 'TRUNCATE ' || tables;
			END IF;
			FOR r IN SELECT seq, last_value, is_called FROM ` + testSchema + `.sequences LOOP
				PERFORM setval(r.seq, r.last_value, r.is_called);
			END LOOP;
			DELETE FROM pg_statistic WHERE starelid IN (SELECT rel FROM ` + testSchema + `.emptied)
				OR starelid IN (SELECT indexrelid FROM pg_index WHERE indrelid IN (SELECT rel FROM ` + testSchema + `.emptied));
			PERFORM pg_stat_reset();
			RETURN NULL;
		END $$`,
		// SECURITY DEFINER: DDL by a test's own less privileged role is
		// logged too.
		`CREATE FUNCTION ` + testSchema + `.log_ddl() RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
		BEGIN
			IF tg_tag LIKE 'DROP%' THEN
				RETURN; -- log_drop has what it dropped
			END IF;
			INSERT INTO ` + testSchema + `.ddl (tag, objid, object_type, identity)
				SELECT command_tag, objid, object_type, object_identity FROM pg_event_trigger_ddl_commands();
			IF NOT FOUND THEN
				INSERT INTO ` + testSchema + `.ddl (tag) VALUES (tg_tag);
			END IF;
		END $$`,
		`CREATE FUNCTION ` + testSchema + `.log_drop() RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
		BEGIN
			INSERT INTO ` + testSchema + `.ddl (tag, objid, object_type, identity)
				SELECT tg_tag, objid, object_type, object_identity FROM pg_event_trigger_dropped_objects() WHERE original;
		END $$`,
		`CREATE EVENT TRIGGER ` + testSchema + `_ddl ON ddl_command_end EXECUTE FUNCTION ` + testSchema + `.log_ddl()`,
		`CREATE EVENT TRIGGER ` + testSchema + `_drop ON sql_drop EXECUTE FUNCTION ` + testSchema + `.log_drop()`,
	}
	for _, st := range stmts {
		if _, err := conn.Exec(ctx, st); err != nil {
			return fmt.Errorf("preparing the template for reuse: %s: %w", firstLine(st), err)
		}
	}
	return nil
}

func firstLine(s string) string {
	for i, r := range s {
		if r == '\n' {
			return s[:i]
		}
	}
	return s
}
