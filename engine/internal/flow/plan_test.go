package flow

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func TestRatePacesAndKeepsItsScheduleWhenLate(t *testing.T) {
	r := store.Rate{Limit: 50, Period: time.Second} // one every 20 ms
	n, _ := conforming(r, nil, t0)
	require.Equal(t, 1, n, "an idle queue lets one go")
	tat := advance(r, nil, t0, 1)
	require.Equal(t, t0.Add(20*time.Millisecond), tat)
	n, at := conforming(r, &tat, t0.Add(5*time.Millisecond))
	require.Zero(t, n)
	require.Equal(t, tat, at, "the next may go at its time")
	// An admission 3 ms late still takes one, and the schedule goes on
	// from where it stood, not from the late admission.
	late := tat.Add(3 * time.Millisecond)
	n, _ = conforming(r, &tat, late)
	require.Equal(t, 1, n)
	require.Equal(t, t0.Add(40*time.Millisecond), advance(r, &tat, late, 1))
	// Up to CatchUp late, it catches up: the runs whose time has come go
	// at once.
	n, _ = conforming(r, &tat, tat.Add(65*time.Millisecond))
	require.Equal(t, 4, n)
	// After an idle spell the schedule starts again at now.
	idle := tat.Add(time.Second)
	require.Equal(t, idle.Add(20*time.Millisecond), advance(r, &tat, idle, 1))
	// A burst of 5 lets 5 go at once after a quiet spell, then paces.
	b := store.Rate{Limit: 50, Period: time.Second, Burst: 5}
	n, _ = conforming(b, nil, t0)
	require.Equal(t, 5, n)
	tat = advance(b, nil, t0, 5)
	n, _ = conforming(b, &tat, t0)
	require.Zero(t, n)
	n, _ = conforming(b, &tat, t0.Add(20*time.Millisecond))
	require.Equal(t, 1, n)
}

func cand(key string, tag float64) store.Candidate {
	return store.Candidate{RunID: uuid.New(), Key: key, Tag: tag}
}

func TestRoomIsTheLeastOfWorkersConcurrencyAndRate(t *testing.T) {
	s := &store.QueueState{Def: store.QueueDef{Concurrency: 5}, Running: 3}
	room, why, _ := Room(s, 10, t0)
	require.Equal(t, 2, room)
	require.Equal(t, HeldConcurrency, why)
	room, why, _ = Room(s, 1, t0)
	require.Equal(t, 1, room)
	require.Equal(t, HeldWorkers, why)
	s.Running = 7 // over the limit (it was lowered): no room, never negative
	room, _, _ = Room(s, 10, t0)
	require.Zero(t, room)
	s = &store.QueueState{Def: store.QueueDef{Rate: store.Rate{Limit: 1, Period: time.Second}}}
	tat := t0.Add(500 * time.Millisecond)
	s.RateTAT = &tat
	room, why, at := Room(s, 10, t0)
	require.Zero(t, room)
	require.Equal(t, HeldRate, why)
	require.Equal(t, tat, at)
	s.Paused = true
	_, why, _ = Room(s, 10, t0)
	require.Equal(t, HeldPaused, why)
}

func TestChooseKeepsKeyLimitsAndRates(t *testing.T) {
	s := &store.QueueState{Def: store.QueueDef{KeyConcurrency: 2}, RunningByKey: map[string]int{"a": 1}, VTime: 3}
	cands := []store.Candidate{cand("a", 4), cand("a", 5), cand("b", 4), cand("b", 5), cand("b", 6), cand("c", 9)}
	cands = append(cands, cands[2]) // listed twice (aged and in order)
	p := Choose(s, cands, 10, nil, t0)
	var keys []string
	for _, c := range p.Picks {
		keys = append(keys, c.Key)
	}
	require.Equal(t, []string{"a", "b", "b", "c"}, keys, "a has one running, b takes two, c one")
	require.Equal(t, 9.0, p.VTime)
	p = Choose(s, cands, 2, nil, t0)
	require.Len(t, p.Picks, 2, "room bounds the picks")

	s = &store.QueueState{Def: store.QueueDef{KeyRate: store.Rate{Limit: 1, Period: time.Second}}, RunningByKey: map[string]int{}}
	later := t0.Add(time.Second)
	p = Choose(s, []store.Candidate{cand("a", 1), cand("a", 2), cand("b", 1), cand("c", 1)}, 10, map[string]time.Time{"c": later}, t0)
	keys = nil
	for _, c := range p.Picks {
		keys = append(keys, c.Key)
	}
	require.Equal(t, []string{"a", "b"}, keys, "one of a per second; c spent its rate")
	require.Equal(t, t0.Add(time.Second), p.KeyTATs["a"])
}
