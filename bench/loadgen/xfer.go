package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// selfCPUMicros is this process's own CPU (user+system), so the script can
// show how the load core's time splits between client, front and upstream.
func selfCPUMicros() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec)*1e6 + float64(t.Usec) }
	return tv(ru.Utime) + tv(ru.Stime)
}

// watchSet is named processes whose CPU is reported next to the server's.
type watchSet struct {
	names []string
	pids  []int
	start []float64
}

func parseWatch(s string) (*watchSet, error) {
	w := &watchSet{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, pid, ok := strings.Cut(f, "=")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || n <= 0 || name == "" || strings.ContainsAny(name, " =") {
			return nil, fmt.Errorf("-watch wants name=pid[,name=pid], got %q", f)
		}
		w.names, w.pids = append(w.names, name), append(w.pids, n)
	}
	return w, nil
}

func (w *watchSet) begin() {
	w.start = w.start[:0]
	for _, p := range w.pids {
		s, _ := sampleProcs([]int{p})
		w.start = append(w.start, s.cpuMicros())
	}
}

func (w *watchSet) end() string {
	var b strings.Builder
	for i, p := range w.pids {
		s, _ := sampleProcs([]int{p})
		fmt.Fprintf(&b, " cpu_%s_us=%.0f", w.names[i], s.cpuMicros()-w.start[i])
	}
	return b.String()
}

// xferConn is one HTTP/1.1 keep-alive connection used for the whole run:
// "single stream" means exactly this.
type xferConn struct {
	c    *tls.Conn
	br   *bufio.Reader
	host string
	buf  []byte
	// rate > 0 makes download a slow reader: at most rate bytes/s, read
	// 64 KiB at a time (a phone on a slow link).
	rate  float64
	start time.Time
	read  int64
}

// pace sleeps until reading more keeps the connection under x.rate and
// returns the largest read to make next.
func (x *xferConn) pace() int {
	if x.rate <= 0 {
		return len(x.buf)
	}
	if x.start.IsZero() {
		x.start = time.Now()
	}
	if d := time.Until(x.start.Add(time.Duration(float64(x.read) / x.rate * float64(time.Second)))); d > 0 {
		time.Sleep(d)
	}
	return min(len(x.buf), 64<<10)
}

func (x *xferConn) download(path string, moved *atomic.Int64) error {
	x.c.SetDeadline(time.Now().Add(transferTimeout))
	req := "GET " + path + " HTTP/1.1\r\nHost: " + x.host + "\r\nUser-Agent: securelink-bench\r\n\r\n"
	if _, err := io.WriteString(x.c, req); err != nil {
		return err
	}
	resp, err := http.ReadResponse(x.br, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ContentLength <= 0 {
		return fmt.Errorf("GET %s: HTTP %d, Content-Length %d", path, resp.StatusCode, resp.ContentLength)
	}
	var got int64
	for {
		n, err := resp.Body.Read(x.buf[:x.pace()])
		got += int64(n)
		x.read += int64(n)
		moved.Add(int64(n))
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("GET %s after %d of %d bytes: %w", path, got, resp.ContentLength, err)
		}
	}
	if got != resp.ContentLength {
		return fmt.Errorf("GET %s: %d bytes, Content-Length %d", path, got, resp.ContentLength)
	}
	return nil
}

// upload sends size bytes and counts them in moved only once the sink
// confirmed it received every one of them.
func (x *xferConn) upload(path string, size int, moved *atomic.Int64) error {
	x.c.SetDeadline(time.Now().Add(transferTimeout))
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: securelink-bench\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", path, x.host, size)
	if _, err := io.WriteString(x.c, head); err != nil {
		return err
	}
	for sent := 0; sent < size; {
		n := min(size-sent, len(x.buf))
		if _, err := x.c.Write(x.buf[:n]); err != nil {
			return fmt.Errorf("POST %s after %d of %d bytes: %w", path, sent, size, err)
		}
		sent += n
	}
	resp, err := http.ReadResponse(x.br, nil)
	if err != nil {
		return fmt.Errorf("POST %s: reading the answer: %w", path, err)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64))
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != strconv.Itoa(size) {
		return fmt.Errorf("POST %s: HTTP %d, sink counted %q of %d bytes", path, resp.StatusCode, b, size)
	}
	moved.Add(int64(size))
	return nil
}

// cmdXfer measures single-stream bulk transfer: GET of an 8 MiB body, or
// POST of size bytes, back to back on one connection for the window.
func cmdXfer(args []string) error {
	fs := flag.NewFlagSet("xfer", flag.ExitOnError)
	mode := fs.String("mode", "download", "download (GET -path) or upload (POST -path)")
	addr := fs.String("addr", "", "the front's host:port")
	pin := fs.String("pin", "", "sha256/<b64> SPKI pin of the front")
	credPath := fs.String("reach", "", "credential file: go through the broker (else direct)")
	caFile := fs.String("ca-file", "", "the broker's certificate (with -reach)")
	path := fs.String("path", "", "default /api/big (download) or /api/sink (upload)")
	size := fs.Int("size", 8<<20, "upload body size in bytes")
	var win window
	win.flags(fs, 2*time.Second, "server pids for CPU accounting (the broker)")
	watch := fs.String("watch", "", "more processes to report CPU of: name=pid[,name=pid]")
	fs.Parse(args)
	if *mode != "download" && *mode != "upload" {
		return errors.New("-mode must be download or upload")
	}
	if *path == "" {
		*path = map[string]string{"download": "/api/big", "upload": "/api/sink"}[*mode]
	}
	if !strings.HasPrefix(*path, "/") || strings.ContainsAny(*path, " \r\n") {
		return errors.New("bad -path")
	}
	if *size < 1 || *size > maxXferSize {
		return errors.New("bad -size")
	}
	d, err := newFrontDialer(*addr, *pin, *credPath, *caFile)
	if err != nil {
		return err
	}
	meter, err := win.meter()
	if err != nil {
		return err
	}
	ws, err := parseWatch(*watch)
	if err != nil {
		return err
	}
	c, err := d.dial(context.Background())
	if err != nil {
		return fmt.Errorf("dial %s: %w", d.via(), err)
	}
	defer c.Close()
	x := &xferConn{c: c, br: bufio.NewReaderSize(c, xferChunk), host: *addr, buf: bytes.Repeat([]byte("u"), xferChunk)}

	var (
		moved    atomic.Int64
		done     atomic.Int64 // transfers completed
		stopping atomic.Bool
		firstErr atomic.Value
		finished = make(chan struct{})
	)
	go func() {
		defer close(finished)
		for !stopping.Load() {
			var err error
			if *mode == "download" {
				err = x.download(*path, &moved)
			} else {
				err = x.upload(*path, *size, &moved)
			}
			if err != nil {
				firstErr.Store(err.Error())
				return
			}
			done.Add(1)
		}
	}()
	time.Sleep(win.warm)
	if err := meter.begin(); err != nil {
		return err
	}
	ws.begin()
	self0 := selfCPUMicros()
	b0, n0, t0 := moved.Load(), done.Load(), time.Now()
	time.Sleep(win.dur)
	b1, n1, secs := moved.Load(), done.Load(), time.Since(t0).Seconds()
	self1 := selfCPUMicros()
	cpu, cerr := meter.end()
	watched := ws.end()
	// Let the transfer in flight finish, so the stream ends cleanly and a
	// cut would be seen.
	stopping.Store(true)
	select {
	case <-finished:
	case <-time.After(transferTimeout + 5*time.Second):
		firstErr.CompareAndSwap(nil, "the last transfer did not finish")
	}
	if cerr != nil {
		return cerr
	}
	bytesMoved := b1 - b0
	cut := 0
	errNote := ""
	if e := firstErr.Load(); e != nil {
		cut = 1
		errNote = " error=" + strconv.Quote(e.(string))
	}
	if bytesMoved <= 0 {
		return fmt.Errorf("no byte moved in the window (%d transfers before)%s", n0, errNote)
	}
	cpuPerGB := cpu / 1e6 / (float64(bytesMoved) / 1e9)
	fmt.Printf("mode=%s via=%s bytes=%d transfers=%d secs=%.2f mbs=%.1f cpu_us=%.0f cpu_s_per_gb=%.3f cpu_self_us=%.0f%s dials=%d cut=%d%s\n",
		*mode, d.via(), bytesMoved, n1-n0, secs, float64(bytesMoved)/secs/1e6, cpu, cpuPerGB, self1-self0, watched, d.dials.Load(), cut, errNote)
	return nil
}
