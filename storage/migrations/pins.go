package migrations

import (
	"errors"
	"fmt"
	"hash/fnv"
)

// pinsFormat is the first byte of a pins filter's encoding.
const pinsFormat = 1

// pinHashes is the number of bits a key sets; with pinBitsPerKey bits per
// key it gives a false positive rate of about 1%.
const (
	pinHashes     = 7
	pinBitsPerKey = 10
)

// MaxPinnedKeys bounds the keys of Pins (about 60 MiB of bits): a schema
// whose runs have more cannot be given routes (Opts.Routes).
const MaxPinnedKeys = 50_000_000

// Pins are the route pins of a schema that held runs when it was given
// routes (Opts.Routes on a schema of one route with runs): the workflow
// IDs, deduplication IDs and debounce keys of those runs (WorkflowKey,
// DedupKey, DebounceKey), which the routes leave in route 0. Those runs
// stay where they are, in route 0, and their run IDs carry no route, so
// the engine finds them there by ID; a later start of one of their
// workflow IDs must look for them there too, or the workflow ID would be
// taken twice, in two routes.
//
// Pins are a Bloom filter: a fixed number of bits per key (about 1.2
// bytes), written once by Migrate in the layout table and read by every
// engine when it learns the routes, so that a start's route is still
// found without a round trip. They never miss a key they were given, and
// hold about 1 in 100 of the others by mistake: such a key is kept in
// route 0 too, by every engine alike (they read the same filter), so
// nothing is looked for in the wrong route; route 0 only takes a little
// more than its share. The zero value is
// not usable; NewPins and ParsePins make one.
type Pins struct {
	bits []byte
}

// NewPins is an empty filter sized for n keys (at least 64 bits).
// The error: n above MaxPinnedKeys.
func NewPins(n int) (*Pins, error) {
	if n > MaxPinnedKeys {
		return nil, fmt.Errorf("%d keys to keep in route 0, more than %d", n, MaxPinnedKeys)
	}
	size := max((n*pinBitsPerKey+7)/8, 8)
	return &Pins{bits: make([]byte, size)}, nil
}

// WorkflowKey is the key of the runs of workflow ID id of workflow name.
func WorkflowKey(name, id string) string { return "w\x00" + name + "\x00" + id }

// DebounceKey is the key of the runs that share debounce key key of
// workflow name: the route key of a start without a workflow ID that is
// debounced.
func DebounceKey(name, key string) string { return "debounce\x00" + name + "\x00" + key }

// DedupKey is the key of the runs that share deduplication ID id in flow
// queue queue: the route key of a start without a workflow ID that is
// deduplicated.
func DedupKey(queue, id string) string { return "dedup\x00" + queue + "\x00" + id }

// positions are the bit positions of key: double hashing of two FNV-1a
// hashes (Kirsch and Mitzenmacher), which is as good as independent ones
// for a Bloom filter.
func (f *Pins) positions(key string) [pinHashes]uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	a := h.Sum64()
	h.Write([]byte{0xff})
	b := h.Sum64() | 1
	m := uint64(len(f.bits)) * 8
	var out [pinHashes]uint64
	for i := range out {
		out[i] = (a + uint64(i)*b) % m
	}
	return out
}

// Add puts key in f.
func (f *Pins) Add(key string) {
	for _, p := range f.positions(key) {
		f.bits[p/8] |= 1 << (p % 8)
	}
}

// Has reports whether f holds key: true for every key added, and for about
// 1 in 100 of the others.
func (f *Pins) Has(key string) bool {
	if f == nil {
		return false
	}
	for _, p := range f.positions(key) {
		if f.bits[p/8]&(1<<(p%8)) == 0 {
			return false
		}
	}
	return true
}

// Bytes is f's encoding: a format byte, the number of hashes, then the
// bits (ParsePins reads it).
func (f *Pins) Bytes() []byte {
	out := make([]byte, 2, 2+len(f.bits))
	out[0], out[1] = pinsFormat, pinHashes
	return append(out, f.bits...)
}

// ErrPinsFormat: an encoding Parse does not read (made by another version, or
// damaged).
var ErrPinsFormat = errors.New("route pins: not a filter this version reads")

// ParsePins reads an encoding Bytes made. nil or empty is no filter (nil, nil):
// a schema whose routes were made without runs.
func ParsePins(b []byte) (*Pins, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) < 10 || b[0] != pinsFormat || b[1] != pinHashes {
		return nil, fmt.Errorf("%w (%d bytes, format %d)", ErrPinsFormat, len(b), b[0])
	}
	return &Pins{bits: append([]byte(nil), b[2:]...)}, nil
}

// Size is the number of bytes f's bits take.
func (f *Pins) Size() int { return len(f.bits) }
