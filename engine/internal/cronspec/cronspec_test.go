package cronspec_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/internal/cronspec"
)

func fires(t *testing.T, s cronspec.Schedule, from, to time.Time) []time.Time {
	t.Helper()
	var out []time.Time
	for at := s.Next(from); !at.IsZero() && at.Before(to); at = s.Next(at) {
		out = append(out, at)
	}
	return out
}

func ny(t *testing.T) *time.Location {
	loc, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	return loc
}

// 2026 changes in New York: 8 March 02:00 EST -> 03:00 EDT; 1 November
// 02:00 EDT -> 01:00 EST.
func TestFixedHourFiresOncePerLocalDayAcrossDST(t *testing.T) {
	loc := ny(t)
	for _, spec := range []string{"30 2 * * *", "30 1 * * *"} {
		s, err := cronspec.Parse(spec, "America/New_York")
		require.NoError(t, err)
		for _, period := range [][2]time.Time{
			{time.Date(2026, 3, 5, 0, 0, 0, 0, loc), time.Date(2026, 3, 12, 0, 0, 0, 0, loc)},
			{time.Date(2026, 10, 29, 0, 0, 0, 0, loc), time.Date(2026, 11, 5, 0, 0, 0, 0, loc)},
		} {
			got := fires(t, s, period[0], period[1])
			require.Len(t, got, 7, spec)
			days := map[string]bool{}
			for _, f := range got {
				days[f.In(loc).Format("2006-01-02")] = true
			}
			require.Len(t, days, 7, "%s: one fire per local day: %v", spec, got)
		}
	}
	s, _ := cronspec.Parse("30 2 * * *", "America/New_York")
	// Spring forward: 02:30 does not exist; it fires at the jump, 03:00 EDT.
	require.Equal(t, time.Date(2026, 3, 8, 7, 0, 0, 0, time.UTC), s.Next(time.Date(2026, 3, 8, 0, 0, 0, 0, loc)))
	// Fall back: 02:30 exists once (EST).
	require.Equal(t, time.Date(2026, 11, 1, 7, 30, 0, 0, time.UTC), s.Next(time.Date(2026, 11, 1, 0, 0, 0, 0, loc)))
	s, _ = cronspec.Parse("30 1 * * *", "America/New_York")
	// Fall back: 01:30 occurs twice; it fires at the first (EDT), once.
	first := s.Next(time.Date(2026, 11, 1, 0, 0, 0, 0, loc))
	require.Equal(t, time.Date(2026, 11, 1, 5, 30, 0, 0, time.UTC), first)
	require.Equal(t, time.Date(2026, 11, 2, 6, 30, 0, 0, time.UTC), s.Next(first), "not again at 01:30 EST")
}

func TestWildcardHourFiresOncePerRealHour(t *testing.T) {
	loc := ny(t)
	s, err := cronspec.Parse("0 * * * *", "America/New_York")
	require.NoError(t, err)
	for day, want := range map[int]int{1: 25, 2: 24} { // 1 November: 25 hours
		from := time.Date(2026, 11, day, 0, 0, 0, 0, loc).Add(-time.Second)
		got := fires(t, s, from, time.Date(2026, 11, day+1, 0, 0, 0, 0, loc))
		require.Len(t, got, want)
		for i := 1; i < len(got); i++ {
			require.Equal(t, time.Hour, got[i].Sub(got[i-1]))
		}
	}
	from := time.Date(2026, 3, 8, 0, 0, 0, 0, loc).Add(-time.Second)
	require.Len(t, fires(t, s, from, time.Date(2026, 3, 9, 0, 0, 0, 0, loc)), 23)
}

func TestGapTimesFireOnce(t *testing.T) {
	loc := ny(t)
	s, err := cronspec.Parse("15,45 2 * * *", "America/New_York")
	require.NoError(t, err)
	got := fires(t, s, time.Date(2026, 3, 8, 0, 0, 0, 0, loc), time.Date(2026, 3, 9, 0, 0, 0, 0, loc))
	require.Equal(t, []time.Time{time.Date(2026, 3, 8, 7, 0, 0, 0, time.UTC)}, got)
}

func TestDescriptorsAndEvery(t *testing.T) {
	s, err := cronspec.Parse("@every 5m", "")
	require.NoError(t, err)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	require.Equal(t, at.Add(5*time.Minute), s.Next(at))
	s, err = cronspec.Parse("@daily", "Europe/Paris")
	require.NoError(t, err)
	require.Equal(t, time.Date(2026, 1, 1, 23, 0, 0, 0, time.UTC), s.Next(at))
	s, err = cronspec.Parse("0 9 * * MON-FRI", "UTC")
	require.NoError(t, err)
	require.Equal(t, time.Date(2026, 1, 2, 9, 0, 0, 0, time.UTC), s.Next(at.Add(10*time.Hour))) // Friday
	s, err = cronspec.Parse("0 12 29 2 *", "UTC")                                               // leap days only
	require.NoError(t, err)
	require.Equal(t, time.Date(2028, 2, 29, 12, 0, 0, 0, time.UTC), s.Next(at))
}

func TestParseRejects(t *testing.T) {
	for spec, msg := range map[string]string{
		"0 0 30 2 *":            "never fires",
		"61 * * * *":            "invalid cron expression",
		"* * * *":               "invalid cron expression",
		"":                      "invalid cron expression",
		"CRON_TZ=UTC 0 * * * *": "time zone",
		"@every -5m":            "invalid cron expression",
		"@fortnightly":          "invalid cron expression",
	} {
		_, err := cronspec.Parse(spec, "UTC")
		require.ErrorContains(t, err, msg, spec)
	}
	for _, tz := range []string{"Mars/Olympus", "Local", "EST5EDT,M3.2.0"} {
		_, err := cronspec.Parse("0 * * * *", tz)
		require.ErrorContains(t, err, "unknown time zone", tz)
	}
}
