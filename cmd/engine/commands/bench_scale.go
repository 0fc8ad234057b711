package commands

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/pgdurable/pgdurable/cmd/engine/internal/enginebench"
)

// scaleProcesses are the process counts of the scale rows.
var scaleProcesses = []int{1, 2, 4}

// benchScale measures the 3-step no-op workflow with n runs in all, shared
// by 1, 2 and 4 engine processes on one database: each process is this
// binary re-run as a scale worker (see scaleWorker), starting and working
// its share, and the row is n over the time from the go signal to the
// last process's last completion.
func benchScale(ctx context.Context, url string, n int) ([]enginebench.Row, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var rows []enginebench.Row
	for _, procs := range scaleProcesses {
		type worker struct {
			cmd   *exec.Cmd
			stdin io.WriteCloser
			out   *bufio.Reader
		}
		var workers []worker
		kill := func() {
			for _, w := range workers {
				_ = w.cmd.Process.Kill()
				_ = w.cmd.Wait()
			}
		}
		for range procs {
			cmd := exec.CommandContext(ctx, self, "--database-url", url, "bench", "--scale-worker", strconv.Itoa(n/procs))
			cmd.Stderr = os.Stderr
			stdin, err := cmd.StdinPipe()
			if err != nil {
				kill()
				return nil, err
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				kill()
				return nil, err
			}
			if err := cmd.Start(); err != nil {
				kill()
				return nil, err
			}
			workers = append(workers, worker{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)})
		}
		for _, w := range workers {
			if line, err := w.out.ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
				kill()
				return nil, fmt.Errorf("scale worker did not start: %q %v", line, err)
			}
		}
		start := time.Now()
		for _, w := range workers {
			_, _ = io.WriteString(w.stdin, "go\n")
		}
		for _, w := range workers {
			if err := w.cmd.Wait(); err != nil {
				kill()
				return nil, fmt.Errorf("scale worker: %w", err)
			}
		}
		elapsed := time.Since(start)
		name := fmt.Sprintf("3-step workflow, %d engine processes", procs)
		if procs == 1 {
			name = "3-step workflow, 1 engine process"
		}
		rows = append(rows, enginebench.Row{Name: name,
			Value: float64(n/procs*procs) / elapsed.Seconds(), Unit: "workflows/s",
			Note: fmt.Sprintf("%d runs started and worked by each process, one database", n/procs)})
	}
	return rows, nil
}

// scaleWorker is one process of benchScale: it says ready on stdout, waits
// for a line on stdin, runs its share and exits.
func scaleWorker(ctx context.Context, url string, n int, stdin io.Reader, stdout io.Writer) error {
	gate := make(chan struct{})
	go func() {
		_, _ = bufio.NewReader(stdin).ReadString('\n')
		close(gate)
	}()
	_, err := enginebench.ScaleWorker(ctx, url, n, func() { fmt.Fprintln(stdout, "ready") }, gate)
	return err
}
