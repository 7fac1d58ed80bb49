package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// procSample is CPU and resident memory of a process tree at one instant.
type procSample struct {
	cpuTicks uint64 // utime+stime, clock ticks, summed over the tree
	rssKiB   uint64 // VmRSS summed over the tree
	n        int    // processes found
}

func (p procSample) cpuMicros() float64 { return float64(p.cpuTicks) * 1e6 / clkTck }

func parsePIDs(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad pid %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// statFields returns the fields after the command name of /proc/<pid>/stat
// (the name may hold spaces and parentheses, so split after the last ')').
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, errors.New("malformed stat")
	}
	return strings.Fields(string(b[i+1:])), nil
}

// tree returns roots plus every live descendant (nginx workers are children
// of the master).
func tree(roots []int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := statFields(pid)
		if err != nil || len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		children[ppid] = append(children[ppid], pid)
	}
	seen := map[int]bool{}
	var out []int
	queue := append([]int(nil), roots...)
	for len(queue) > 0 && len(out) < 4096 {
		p := queue[0]
		queue = queue[1:]
		if seen[p] {
			continue
		}
		seen[p] = true
		out = append(out, p)
		queue = append(queue, children[p]...)
	}
	return out
}

func sampleProcs(roots []int) (procSample, error) {
	var s procSample
	for _, pid := range tree(roots) {
		f, err := statFields(pid)
		if err != nil {
			continue // exited between listing and reading
		}
		// After ')': state(0) ppid(1) ... utime(11) stime(12).
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseUint(f[11], 10, 64)
		st, _ := strconv.ParseUint(f[12], 10, 64)
		s.cpuTicks += ut + st
		s.rssKiB += vmRSS(pid)
		s.n++
	}
	if s.n == 0 {
		return s, fmt.Errorf("no live process among %v", roots)
	}
	return s, nil
}

func vmRSS(pid int) uint64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "VmRSS:") {
			fs := strings.Fields(line)
			if len(fs) >= 2 {
				v, _ := strconv.ParseUint(fs[1], 10, 64)
				return v
			}
		}
	}
	return 0
}

func cmdProc(args []string) error {
	fs := flag.NewFlagSet("proc", flag.ExitOnError)
	pids := fs.String("pids", "", "comma-separated root pids")
	fs.Parse(args)
	roots, err := parsePIDs(*pids)
	if err != nil || len(roots) == 0 {
		return fmt.Errorf("need -pids: %v", err)
	}
	s, err := sampleProcs(roots)
	if err != nil {
		return err
	}
	fmt.Printf("cpu_us=%.0f rss_kib=%d procs=%d\n", s.cpuMicros(), s.rssKiB, s.n)
	return nil
}

// cpuMeter brackets a measured window; a nil meter measures nothing.
type cpuMeter struct {
	roots []int
	start procSample
}

// window is the measured-run flags handshakes, echo and xfer share: an
// unmeasured warm-up, then a measured duration with the server's CPU read
// at its edges.
type window struct {
	dur, warm time.Duration
	pids      string
}

func (w *window) flags(fs *flag.FlagSet, warmup time.Duration, pidsUsage string) {
	fs.DurationVar(&w.dur, "duration", 10*time.Second, "measured window")
	fs.DurationVar(&w.warm, "warmup", warmup, "unmeasured warm-up")
	fs.StringVar(&w.pids, "pids", "", pidsUsage)
}

// meter checks the window's bounds and opens the CPU meter on its pids.
func (w *window) meter() (*cpuMeter, error) {
	if w.dur <= 0 || w.dur > maxDuration || w.warm < 0 || w.warm > maxDuration {
		return nil, errors.New("bad -duration/-warmup")
	}
	return newCPUMeter(w.pids)
}

// loopResult is what window.loop counted inside the measured window.
type loopResult struct {
	ok, fail, bytes int64
	secs, cpu       float64 // measured seconds, server CPU µs
	lastErr         string
}

// loop runs workers goroutines, each calling op back to back, through the
// warm-up and the measured window; only operations that end inside the
// window count (op returns the bytes it moved).
func (w *window) loop(workers int, op func(worker int) (int64, error)) (loopResult, error) {
	var res loopResult
	meter, err := w.meter()
	if err != nil {
		return res, err
	}
	var (
		counting         atomic.Bool
		ok, fail, nbytes atomic.Int64
		lastErr          atomic.Value
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				n, err := op(i)
				if !counting.Load() {
					continue
				}
				if err != nil {
					fail.Add(1)
					lastErr.Store(err.Error())
					continue
				}
				ok.Add(1)
				nbytes.Add(n)
			}
		}()
	}
	time.Sleep(w.warm)
	if err := meter.begin(); err != nil {
		close(stop)
		wg.Wait()
		return res, err
	}
	counting.Store(true)
	t0 := time.Now()
	time.Sleep(w.dur)
	counting.Store(false)
	res.secs = time.Since(t0).Seconds()
	res.cpu, err = meter.end()
	close(stop)
	wg.Wait()
	res.ok, res.fail, res.bytes = ok.Load(), fail.Load(), nbytes.Load()
	res.lastErr, _ = lastErr.Load().(string)
	return res, err
}

func newCPUMeter(pids string) (*cpuMeter, error) {
	if pids == "" {
		return nil, nil
	}
	roots, err := parsePIDs(pids)
	if err != nil {
		return nil, err
	}
	return &cpuMeter{roots: roots}, nil
}

func (m *cpuMeter) begin() error {
	if m == nil {
		return nil
	}
	s, err := sampleProcs(m.roots)
	m.start = s
	return err
}

// end returns server CPU µs spent since begin.
func (m *cpuMeter) end() (float64, error) {
	if m == nil {
		return 0, nil
	}
	s, err := sampleProcs(m.roots)
	if err != nil {
		return 0, err
	}
	return s.cpuMicros() - m.start.cpuMicros(), nil
}
