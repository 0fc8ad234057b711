// Package cronspec turns a schedule's cron expression and time zone into
// fire times. It is the one place robfig/cron/v3 is imported (TestDependencyRule enforces it):
// robfig parses; the fire times follow ISC (Vixie) cron's rule for daylight
// saving changes, which robfig's own Next does not (it skips a day whose
// fire time falls in the spring-forward gap):
//
//   - An expression with a fixed hour ("30 2 * * *", "@daily") names local
//     wall-clock times. One that does not exist on the spring-forward day
//     fires once, at the first valid instant after the jump (03:00 for
//     02:30 in America/New_York); one that occurs twice on the fall-back
//     day fires once, at its first occurrence.
//   - An expression whose hour is a wildcard ("0 * * * *", "@hourly")
//     names real hours: it fires once per real hour that matches, 25 times
//     on the fall-back day and 23 on the spring-forward day, with no burst
//     and no gap.
//   - "@every d" fires every d of real time from its previous fire.
//
// Fire times are UTC instants, deduplicated: several wall-clock times that
// fall in one gap fire once.
package cronspec

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// starBit is robfig's marker for a field written as "*" (parser.go).
const starBit = 1 << 63

// horizon bounds the search for the next fire time: 8 years cover every
// date that exists (29 February included).
const horizon = 8*366*24*time.Hour + 24*time.Hour

// Schedule yields fire times.
type Schedule interface {
	// Next returns the first fire time strictly after t, in UTC, or the
	// zero time when there is none within 8 years.
	Next(t time.Time) time.Time
}

// Parse validates spec (5 fields, or a descriptor: @yearly, @monthly,
// @weekly, @daily, @hourly, @every <duration>) in the IANA time zone tz
// ("" means UTC) and returns its schedule. An expression that never fires
// (30 February) is an error, as is a time zone prefix inside spec.
func Parse(spec, tz string) (Schedule, error) {
	spec = strings.TrimSpace(spec)
	if strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ=") {
		return nil, errors.New("give the time zone as the schedule's time zone, not inside the expression")
	}
	if tz == "" {
		tz = "UTC"
	}
	loc, err := time.LoadLocation(tz)
	if err != nil || tz == "Local" {
		return nil, fmt.Errorf("unknown time zone %q: use an IANA name such as America/New_York", tz)
	}
	if d, ok := strings.CutPrefix(spec, "@every "); ok {
		// robfig turns anything under a second, negative too, into 1 s.
		// and truncates fractions of a second: "1500ms" would run every 1 s.
		if every, err := time.ParseDuration(strings.TrimSpace(d)); err != nil || every < time.Second || every%time.Second != 0 {
			return nil, fmt.Errorf("invalid cron expression %q: @every needs a whole number of seconds, at least 1s", spec)
		}
	}
	parsed, err := cron.ParseStandard(spec)
	if err != nil {
		return nil, fmt.Errorf("invalid cron expression %q: %v", spec, err)
	}
	var s Schedule
	switch p := parsed.(type) {
	case *cron.SpecSchedule:
		s = wallClock{spec: p, loc: loc}
	case cron.ConstantDelaySchedule:
		s = every{p}
	default:
		return nil, fmt.Errorf("unsupported cron expression %q", spec)
	}
	if s.Next(time.Now()).IsZero() {
		return nil, fmt.Errorf("cron expression %q never fires", spec)
	}
	return s, nil
}

type every struct{ s cron.ConstantDelaySchedule }

func (e every) Next(t time.Time) time.Time { return e.s.Next(t).UTC() }

type wallClock struct {
	spec *cron.SpecSchedule
	loc  *time.Location
}

func (w wallClock) Next(t time.Time) time.Time {
	if w.spec.Hour&starBit != 0 {
		return w.nextRealMinute(t)
	}
	return w.nextWallTime(t)
}

func has(mask uint64, v int) bool { return mask&(1<<uint(v)) != 0 }

// dayMatches is robfig's rule: with either day field a wildcard both must
// match, otherwise either may.
func (w wallClock) dayMatches(y int, m time.Month, d int) bool {
	wd := time.Date(y, m, d, 12, 0, 0, 0, time.UTC).Weekday()
	if !has(w.spec.Month, int(m)) {
		return false
	}
	dom, dow := has(w.spec.Dom, d), has(w.spec.Dow, int(wd))
	if w.spec.Dom&starBit != 0 || w.spec.Dow&starBit != 0 {
		return dom && dow
	}
	return dom || dow
}

// nextWallTime walks local calendar days and their listed wall-clock times,
// resolving each to an instant.
func (w wallClock) nextWallTime(t time.Time) time.Time {
	local := t.In(w.loc)
	day := time.Date(local.Year(), local.Month(), local.Day(), 12, 0, 0, 0, time.UTC)
	for i := 0; i < int(horizon/(24*time.Hour)); i++ {
		d := day.AddDate(0, 0, i)
		if !w.dayMatches(d.Year(), d.Month(), d.Day()) {
			continue
		}
		for h := range 24 {
			if !has(w.spec.Hour, h) {
				continue
			}
			for m := range 60 {
				if !has(w.spec.Minute, m) {
					continue
				}
				if at := resolve(d.Year(), d.Month(), d.Day(), h, m, w.loc); at.After(t) {
					return at.UTC()
				}
			}
		}
	}
	return time.Time{}
}

// resolve maps a local wall-clock time to an instant: its first occurrence
// when it occurs twice, the end of the gap when it does not exist.
func resolve(y int, mo time.Month, d, h, m int, loc *time.Location) time.Time {
	wall := time.Date(y, mo, d, h, m, 0, 0, time.UTC)
	var best time.Time
	var lo, hi time.Time
	for _, probe := range []time.Time{wall.Add(-26 * time.Hour), time.Date(y, mo, d, h, m, 0, 0, loc), wall.Add(26 * time.Hour)} {
		_, off := probe.In(loc).Zone()
		c := wall.Add(-time.Duration(off) * time.Second)
		if wallOf(c, loc).Equal(wall) && (best.IsZero() || c.Before(best)) {
			best = c
		}
		if lo.IsZero() || c.Before(lo) {
			lo = c
		}
		if hi.IsZero() || c.After(hi) {
			hi = c
		}
	}
	if !best.IsZero() {
		return best
	}
	// In the gap: the first instant whose wall clock is past wall is the
	// jump itself. Between the candidates the wall clock only moves forward.
	for hi.Sub(lo) > time.Second {
		mid := lo.Add(hi.Sub(lo) / 2).Truncate(time.Second)
		if wallOf(mid, loc).After(wall) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// wallOf is t's local wall clock as a UTC carrier, comparable across offsets.
func wallOf(t time.Time, loc *time.Location) time.Time {
	l := t.In(loc)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), 0, time.UTC)
}

// nextRealMinute walks real minutes (whose local hour always matches) and
// fires on those whose local date and minute match.
func (w wallClock) nextRealMinute(t time.Time) time.Time {
	at := t.Truncate(time.Minute).Add(time.Minute)
	end := t.Add(horizon)
	for at.Before(end) {
		l := at.In(w.loc)
		if !w.dayMatches(l.Year(), l.Month(), l.Day()) {
			next := time.Date(l.Year(), l.Month(), l.Day()+1, 0, 0, 0, 0, w.loc)
			if !next.After(at) {
				next = at.Add(time.Minute)
			}
			at = next.Truncate(time.Minute)
			continue
		}
		if has(w.spec.Hour, l.Hour()) && has(w.spec.Minute, l.Minute()) {
			return at.UTC()
		}
		at = at.Add(time.Minute)
	}
	return time.Time{}
}
