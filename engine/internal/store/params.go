package store

import (
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// The array parameters of the batch statements are built as pgx's own
// types, which it encodes in binary directly. uuid.UUID is a driver.Valuer,
// so pgx encodes it by calling Value (a 36-byte string) and parsing that
// back, element by element; slices of pointers take its reflection path.
// In a profile of 10-step workflows at load, encoding the arrays of the
// record writes was a fifth of the engine's CPU, nearly all of it UUIDs.

// uuidArray is a uuid[] parameter.
type uuidArray = pgtype.FlatArray[pgtype.UUID]

// uuidParam is a uuid parameter that pgx encodes without formatting it.
func uuidParam(id uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: id, Valid: true} }

func uuidOrNull(id *uuid.UUID) pgtype.UUID {
	if id == nil {
		return pgtype.UUID{}
	}
	return uuidParam(*id)
}

func textOrNull(s *string) pgtype.Text {
	if s == nil {
		return pgtype.Text{}
	}
	return pgtype.Text{String: *s, Valid: true}
}

// jsonParam is a text parameter holding a JSON document (cast to jsonb in
// the statement), NULL for nil.
func jsonParam(b []byte) pgtype.Text {
	if b == nil {
		return pgtype.Text{}
	}
	return pgtype.Text{String: string(b), Valid: true}
}

func timeOrNull(t *time.Time) pgtype.Timestamptz {
	if t == nil {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: *t, Valid: true}
}

func int4OrNull(v *int) pgtype.Int4 {
	if v == nil {
		return pgtype.Int4{}
	}
	return pgtype.Int4{Int32: int32(*v), Valid: true}
}

func int8OrNull(v *int64) pgtype.Int8 {
	if v == nil {
		return pgtype.Int8{}
	}
	return pgtype.Int8{Int64: *v, Valid: true}
}

// uuids is ids as a uuid[] parameter.
func uuids(ids []uuid.UUID) uuidArray {
	out := make(uuidArray, len(ids))
	for i, id := range ids {
		out[i] = uuidParam(id)
	}
	return out
}
