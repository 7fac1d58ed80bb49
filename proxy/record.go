package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
)

// recorder observes one request for metrics: the status sent, the body bytes
// written to the client and read from it. It forwards Flush, Hijack and the
// deadlines (via Unwrap) so streaming and upgrades behave as without it.
// It only exists while metrics are on.
type recorder struct {
	http.ResponseWriter
	ctl    *http.ResponseController
	status int
	out    int64
	in     countingBody
}

func newRecorder(w http.ResponseWriter, r *http.Request) *recorder {
	rec := &recorder{ResponseWriter: w, ctl: http.NewResponseController(w)}
	if r.Body != nil && r.Body != http.NoBody {
		rec.in.rc = r.Body
		r.Body = &rec.in
	}
	return rec
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 || (r.status < 200 && code >= 200) {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	n, err := r.ResponseWriter.Write(p)
	r.out += int64(n)
	return n, err
}

func (r *recorder) Flush() { _ = r.ctl.Flush() }

func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := r.ctl.Hijack()
	if err == nil {
		r.status = http.StatusSwitchingProtocols
	}
	return c, brw, err
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// countingBody counts request-body bytes read.
type countingBody struct {
	rc io.ReadCloser
	n  int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.n += int64(n)
	return n, err
}

func (b *countingBody) Close() error { return b.rc.Close() }
