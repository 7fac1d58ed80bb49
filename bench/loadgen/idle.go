package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

func cmdIdle(args []string) error {
	fs := flag.NewFlagSet("idle", flag.ExitOnError)
	url := fs.String("url", "", "wss://127.0.0.1:PORT/relay/ws")
	pin := fs.String("pin", "", "sha256/<b64> SPKI pin of the server")
	conns := fs.Int("conns", 1000, "idle WebSockets to open")
	par := fs.Int("parallel", 16, "dials in flight")
	settle := fs.Duration("settle", 3*time.Second, "wait before measuring RSS")
	pids := fs.String("pids", "", "server pids for RSS accounting")
	fs.Parse(args)
	if err := wsTarget(*url); err != nil {
		return err
	}
	if *conns < 1 || *conns > maxConns || *par < 1 || *par > 256 || *settle < 0 || *settle > maxDuration {
		return errors.New("bad -conns/-parallel/-settle")
	}
	roots, err := parsePIDs(*pids)
	if err != nil || len(roots) == 0 {
		return fmt.Errorf("need -pids: %v", err)
	}
	cfg, err := clientTLS(*pin, []string{"http/1.1"})
	if err != nil {
		return err
	}
	before, err := sampleProcs(roots)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *settle+5*time.Minute)
	defer cancel()
	cs := make([]*websocket.Conn, *conns)
	defer func() {
		for _, c := range cs {
			if c != nil {
				c.CloseNow()
			}
		}
	}()
	t0 := time.Now()
	err = dialAll(*conns, *par, func(i int) error {
		c, err := dialWS(ctx, *url, cfg)
		if err != nil {
			return fmt.Errorf("dial %d: %v", i, err)
		}
		cs[i] = c
		if err := relayAuth(ctx, c, i+1); err != nil {
			return fmt.Errorf("auth %d: %v", i, err)
		}
		// Keep the connection read side alive (pongs, closes) without
		// touching the server: an idle client is what is measured.
		c.CloseRead(ctx)
		return nil
	})
	if err != nil {
		return err
	}
	openSecs := time.Since(t0).Seconds()
	time.Sleep(*settle)
	after, err := sampleProcs(roots)
	if err != nil {
		return err
	}
	delta := float64(after.rssKiB) - float64(before.rssKiB)
	perK := delta / 1024 * 1000 / float64(*conns)
	fmt.Printf("conns=%d open_secs=%.2f rss_before_kib=%d rss_after_kib=%d mib_per_1000=%.1f\n",
		*conns, openSecs, before.rssKiB, after.rssKiB, perK)
	return nil
}

// dialAll runs open(i) for i in [0, n) on par workers, each taking the
// next index; after the first error no new one starts, and it is returned.
func dialAll(n, par int, open func(i int) error) error {
	var (
		next     atomic.Int64
		firstErr atomic.Pointer[error]
		wg       sync.WaitGroup
	)
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || firstErr.Load() != nil {
					return
				}
				if err := open(i); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return *e
	}
	return nil
}
