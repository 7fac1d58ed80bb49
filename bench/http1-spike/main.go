// Command http1-spike measures what serving HTTP/1.1 outside net/http
// could win for the front's small GET (docs/decisions.md, "HTTP/1.1
// outside net/http"): the same TLS server answering 100 bytes itself on
// net/http and on fasthttp, and fasthttp as a keep-alive reverse proxy to
// the bench upstream. It is a measuring tool, not part of the product: no
// policy, no pinning, a throwaway certificate.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"flag"
	"log"
	"math/big"
	"net"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"
)

func throwawayCert() tls.Certificate {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		log.Fatal(err)
	}
	tpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "http1-spike"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &k.PublicKey, k)
	if err != nil {
		log.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
}

func main() {
	mode := flag.String("mode", "", "static-nethttp | static-fasthttp | proxy-fasthttp")
	listen := flag.String("listen", "127.0.0.1:0", "TLS listen address")
	up := flag.String("up", "", "upstream host:port (proxy-fasthttp): /api/X is sent as /X")
	flag.Parse()
	body := make([]byte, 100) // the size of the upstream's /small
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	tln := tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{throwawayCert()}, NextProtos: []string{"http/1.1"}})
	switch *mode {
	case "static-nethttp":
		log.Fatal(http.Serve(tln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(body) })))
	case "static-fasthttp":
		log.Fatal(fasthttp.Serve(tln, func(c *fasthttp.RequestCtx) { c.Write(body) }))
	case "proxy-fasthttp":
		hc := &fasthttp.HostClient{Addr: *up, MaxConns: 64}
		log.Fatal(fasthttp.Serve(tln, func(c *fasthttp.RequestCtx) {
			req := &c.Request
			req.Header.Del("Connection")
			if p := req.URI().Path(); len(p) >= 4 {
				req.URI().SetPath(string(p[len("/api"):]))
			}
			req.URI().SetScheme("http")
			req.SetHost(*up)
			if err := hc.Do(req, &c.Response); err != nil {
				c.Error("bad gateway", fasthttp.StatusBadGateway)
			}
		}))
	default:
		log.Fatal("-mode: static-nethttp, static-fasthttp or proxy-fasthttp")
	}
}
