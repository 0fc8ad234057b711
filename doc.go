// Package pgdurable is the root of the pgdurable module: a durable workflow
// engine for Go that needs nothing but PostgreSQL. The API lives in engine,
// activities and compensation; this package holds only repository-wide tests.
package pgdurable
