package enginebench

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuSample is where the machine's CPU time had gone at one moment: this
// process's (the engine's, or the River reference's) and the whole
// machine's busy time. On a machine of its own, the rest is PostgreSQL's:
// a row's CPU per unit then says which side a change has to make cheaper,
// which throughput alone does not on a machine whose cores are all busy.
type cpuSample struct {
	self, busy time.Duration
	ok         bool
}

// clockTick is the unit of /proc/stat: USER_HZ, 100 on every Linux
// architecture Go supports (the kernel fixes it for user space whatever
// its own HZ).
const clockTick = 10 * time.Millisecond

// readCPU samples the clock; ok is false where /proc/stat or getrusage
// cannot be read (not Linux), and the CPU rows are then left out.
func readCPU() cpuSample {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return cpuSample{}
	}
	self := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuSample{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return cpuSample{}
	}
	var busy int64
	for i, f := range fields[1:] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return cpuSample{}
		}
		// idle and iowait are not busy; guest time is counted in user
		// time already.
		if i == 3 || i == 4 || i >= 8 {
			continue
		}
		busy += v
	}
	return cpuSample{self: self, busy: time.Duration(busy) * clockTick, ok: true}
}

// cpuCost is CPU time per unit between two samples, in milliseconds: this
// process's, and the rest of the machine's.
type cpuCost struct {
	engine, other float64
	ok            bool
}

func (a cpuSample) costTo(b cpuSample, n int) cpuCost {
	if !a.ok || !b.ok || n <= 0 {
		return cpuCost{}
	}
	self := b.self - a.self
	other := max(b.busy-a.busy-self, 0)
	per := func(d time.Duration) float64 { return d.Seconds() * 1000 / float64(n) }
	return cpuCost{engine: per(self), other: per(other), ok: true}
}
