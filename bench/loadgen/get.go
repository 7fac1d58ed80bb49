package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"
)

// cmdGet is the script's sanity check before each server is measured: a 421
// or 502 counted as a "request" by wrk would make a meaningless figure.
func cmdGet(args []string) error {
	fs := flag.NewFlagSet("get", flag.ExitOnError)
	url := fs.String("url", "", "https://127.0.0.1:PORT/path")
	pin := fs.String("pin", "", "sha256/<b64> SPKI pin of the server")
	fs.Parse(args)
	if err := loopbackURL(*url); err != nil {
		return err
	}
	cfg, err := clientTLS(*pin, []string{"http/1.1"})
	if err != nil {
		return err
	}
	cl := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableCompression: true}}
	resp, err := cl.Get(*url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	fmt.Printf("status=%d bytes=%d proto=%s\n", resp.StatusCode, n, resp.Proto)
	return nil
}
