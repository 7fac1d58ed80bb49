package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

func cmdFreePorts(args []string) error {
	fs := flag.NewFlagSet("freeports", flag.ExitOnError)
	n := fs.Int("n", 1, "how many ports")
	fs.Parse(args)
	if *n < 1 || *n > 16 {
		return errors.New("-n must be 1..16")
	}
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	var ports []string
	for i := 0; i < *n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		lns = append(lns, l)
		ports = append(ports, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	fmt.Println(strings.Join(ports, " "))
	return nil
}

func cmdWaitPort(args []string) error {
	fs := flag.NewFlagSet("waitport", flag.ExitOnError)
	addr := fs.String("addr", "", "host:port")
	timeout := fs.Duration("timeout", 20*time.Second, "give up after")
	fs.Parse(args)
	if err := loopbackOnly(*addr); err != nil {
		return err
	}
	deadline := time.Now().Add(min(*timeout, maxDuration))
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", *addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not accepting after %v", *addr, *timeout)
}
