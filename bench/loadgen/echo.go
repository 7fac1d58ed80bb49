package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// echoPayload is a Relay-shaped JSON text message of exactly size bytes.
func echoPayload(size int) []byte {
	head := `{"channel":"bench","type":"echo","id":"0","payload":{"data":"`
	tail := `"}}`
	pad := size - len(head) - len(tail)
	if pad < 0 {
		return bytes.Repeat([]byte("x"), size)
	}
	return []byte(head + strings.Repeat("x", pad) + tail)
}

func cmdEcho(args []string) error {
	fs := flag.NewFlagSet("echo", flag.ExitOnError)
	url := fs.String("url", "", "wss://127.0.0.1:PORT/relay/ws")
	pin := fs.String("pin", "", "sha256/<b64> SPKI pin of the server")
	conns := fs.Int("conns", 1, "connections, one message in flight each")
	size := fs.Int("size", 1024, "message size in bytes")
	var win window
	win.flags(fs, time.Second, "server pids for CPU accounting")
	credPath := fs.String("reach", "", "credential file: each connection is a broker stream")
	caFile := fs.String("ca-file", "", "the broker's certificate (with -reach)")
	watch := fs.String("watch", "", "more processes to report CPU of: name=pid[,name=pid]")
	bulkRate := fs.Float64("bulk-rate", 0, "also download -bulk-path back to back on one more connection (broker stream), read at this many bytes/s; 0 = none")
	bulkPath := fs.String("bulk-path", "/api/bulk?n=4", "what the bulk connection GETs (default 32 MiB, 4× the broker's stream queue)")
	fs.Parse(args)
	if err := wsTarget(*url); err != nil {
		return err
	}
	if *bulkRate < 0 || *bulkRate > 1e10 {
		return errors.New("bad -bulk-rate")
	}
	if !strings.HasPrefix(*bulkPath, "/") || strings.ContainsAny(*bulkPath, " \r\n") {
		return errors.New("bad -bulk-path")
	}
	ws, err := parseWatch(*watch)
	if err != nil {
		return err
	}
	addr, _, _ := strings.Cut(strings.TrimPrefix(*url, "wss://"), "/")
	var viaBroker *frontDialer
	if *credPath != "" {
		if viaBroker, err = newFrontDialer(addr, *pin, *credPath, *caFile); err != nil {
			return err
		}
	}
	if *conns < 1 || *conns > maxConns || *size < 1 || *size > maxMessage {
		return errors.New("bad -conns/-size")
	}
	cfg, err := clientTLS(*pin, []string{"http/1.1"})
	if err != nil {
		return err
	}
	meter, err := win.meter()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), win.warm+win.dur+time.Minute)
	defer cancel()
	cs := make([]*websocket.Conn, 0, *conns)
	defer func() {
		for _, c := range cs {
			c.CloseNow()
		}
	}()
	for i := 0; i < *conns; i++ {
		var c *websocket.Conn
		if viaBroker != nil {
			c, err = dialWSVia(ctx, *url, viaBroker.dial)
		} else {
			c, err = dialWS(ctx, *url, cfg)
		}
		if err != nil {
			return fmt.Errorf("dial %d: %w", i, err)
		}
		cs = append(cs, c)
		if err := relayAuth(ctx, c, i+1); err != nil {
			return fmt.Errorf("auth %d: %w", i, err)
		}
	}
	var bulk *bulkLoad
	if *bulkRate > 0 {
		d := viaBroker
		if d == nil {
			if d, err = newFrontDialer(addr, *pin, "", ""); err != nil {
				return err
			}
		}
		if bulk, err = startBulk(ctx, d, addr, *bulkPath, *bulkRate); err != nil {
			return err
		}
		defer bulk.stop()
	}
	msg := echoPayload(*size)
	var (
		counting atomic.Bool
		stopping atomic.Bool
		total    atomic.Int64
		mu       sync.Mutex
		samples  = make([]int64, 0, 1<<16)
		firstErr atomic.Value
	)
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func(c *websocket.Conn) {
			defer wg.Done()
			local := make([]int64, 0, 1<<12)
			buf := make([]byte, 0, *size+64)
			flush := func() {
				mu.Lock()
				if len(samples)+len(local) <= maxSamples {
					samples = append(samples, local...)
				}
				mu.Unlock()
				local = local[:0]
			}
			defer flush()
			for !stopping.Load() {
				t0 := time.Now()
				if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					return
				}
				_, rd, err := c.Reader(ctx)
				if err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					return
				}
				buf, err = readAllBounded(rd, buf[:0], maxMessage)
				if err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					return
				}
				rtt := time.Since(t0)
				if len(buf) != len(msg) {
					firstErr.CompareAndSwap(nil, fmt.Sprintf("echo of %d bytes, sent %d", len(buf), len(msg)))
					return
				}
				if counting.Load() {
					total.Add(1)
					local = append(local, int64(rtt))
					if len(local) == cap(local) {
						flush()
					}
				}
			}
		}(c)
	}
	time.Sleep(win.warm)
	if err := meter.begin(); err != nil {
		stopping.Store(true)
		cancel()
		wg.Wait()
		return err
	}
	ws.begin()
	self0 := selfCPUMicros()
	bulk0 := bulk.bytes()
	counting.Store(true)
	t0 := time.Now()
	time.Sleep(win.dur)
	counting.Store(false)
	secs := time.Since(t0).Seconds()
	bulkNote := bulk.report(bulk.bytes()-bulk0, secs)
	self1 := selfCPUMicros()
	cpu, cerr := meter.end()
	watched := fmt.Sprintf(" cpu_self_us=%.0f", self1-self0) + ws.end()
	n := total.Load()
	stopping.Store(true)
	waitBounded(&wg, 5*time.Second)
	if cerr != nil {
		return cerr
	}
	if e := firstErr.Load(); e != nil && n == 0 {
		return fmt.Errorf("echo failed: %v", e)
	}
	if n == 0 {
		return errors.New("no echo completed")
	}
	mu.Lock()
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	p50, p99, p999, worst := pct(samples, 0.50), pct(samples, 0.99), pct(samples, 0.999), pct(samples, 1)
	mu.Unlock()
	errNote := ""
	if e := firstErr.Load(); e != nil {
		errNote = " error=" + strconv.Quote(e.(string))
	}
	fmt.Printf("ops=%d secs=%.2f rate=%.1f p50_us=%.1f p99_us=%.1f p999_us=%.1f max_us=%.1f cpu_us=%.0f cpu_per_op_us=%.2f%s%s%s\n",
		n, secs, float64(n)/secs, float64(p50)/1e3, float64(p99)/1e3, float64(p999)/1e3, float64(worst)/1e3,
		cpu, cpu/float64(n), watched, bulkNote, errNote)
	return nil
}

// bulkLoad is the concurrent bulk stream of `echo -bulk-rate`: back-to-back
// GETs (default 32 MiB) on one connection whose reader keeps to a rate, so
// the front has more to send than the client takes.
type bulkLoad struct {
	x        *xferConn
	moved    atomic.Int64
	stopping atomic.Bool
	firstErr atomic.Value
	done     chan struct{}
}

func startBulk(ctx context.Context, d *frontDialer, host, path string, rate float64) (*bulkLoad, error) {
	c, err := d.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("bulk dial %s: %w", d.via(), err)
	}
	b := &bulkLoad{
		x:    &xferConn{c: c, br: bufio.NewReaderSize(c, 64<<10), host: host, buf: make([]byte, xferChunk), rate: rate},
		done: make(chan struct{}),
	}
	go func() {
		defer close(b.done)
		for !b.stopping.Load() {
			if err := b.x.download(path, &b.moved); err != nil {
				if !b.stopping.Load() {
					b.firstErr.Store(err.Error())
				}
				return
			}
		}
	}()
	return b, nil
}

func (b *bulkLoad) bytes() int64 {
	if b == nil {
		return 0
	}
	return b.moved.Load()
}

// report is the bulk stream's part of the output line: its rate in the
// window and whether it was cut before the end.
func (b *bulkLoad) report(moved int64, secs float64) string {
	if b == nil {
		return ""
	}
	cut, note := 0, ""
	if e := b.firstErr.Load(); e != nil {
		cut, note = 1, " bulk_error="+strconv.Quote(e.(string))
	}
	return fmt.Sprintf(" bulk_mbs=%.2f bulk_cut=%d%s", float64(moved)/secs/1e6, cut, note)
}

// stop ends the bulk stream mid-transfer: closing is the end, not a cut.
func (b *bulkLoad) stop() {
	b.stopping.Store(true)
	b.x.c.Close()
	select {
	case <-b.done:
	case <-time.After(5 * time.Second):
	}
}

func waitBounded(wg *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

func pct(sorted []int64, q float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return sorted[i]
}
