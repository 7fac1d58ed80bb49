package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// readBoth reads data as the direct path does (readResponse, the
// connection's 4 KiB reader) and as http.ReadResponse does, each answer's
// body to its end and then what is left of the stream.
type readResult struct {
	resp  *http.Response
	err   error
	body  []byte
	bErr  error
	rest  []byte
	taken bool // readResponse parsed it itself
}

func readWith(data []byte, method string, own bool, chunk int) readResult {
	return readAfter(nil, data, method, own, chunk)
}

// readAfter is readWith on data behind a first answer, prev, read to its
// end on the same reader (and, for readResponse, the same slot, as one
// pooled exchange serves one answer after another): what the first left in
// the slot must not show in the second, nor the second change the values
// already handed on from the first.
func readAfter(prev, data []byte, method string, own bool, chunk int) (r readResult) {
	if prev != nil {
		data = append(bytes.Clone(prev), data...)
	}
	var src io.Reader = bytes.NewReader(data)
	if chunk > 0 {
		src = &chunkReader{data: data, n: chunk}
	}
	br := bufio.NewReaderSize(src, 4<<10)
	req := &http.Request{Method: method}
	var rs responseSlot
	if prev != nil {
		first, err := readOne(br, &http.Request{Method: http.MethodGet}, &rs, own)
		if err != nil {
			panic("the first answer failed: " + err.Error())
		}
		if _, err := io.Copy(io.Discard, first.Body); err != nil {
			panic(err)
		}
		if handed := first.Header["X-Prev"]; own {
			defer func() {
				if len(handed) != 1 || handed[0] != "first" {
					r.err = errors.New("the second answer changed the first's header values")
				}
			}()
		}
	}
	r.resp, r.err = readOne(br, req, &rs, own)
	r.taken = own && r.resp == &rs.resp
	if r.err != nil {
		return r
	}
	r.body, r.bErr = io.ReadAll(r.resp.Body)
	r.rest, _ = io.ReadAll(br)
	return r
}

// prevAnswer is the answer readAfter reads first.
var prevAnswer = []byte("HTTP/1.1 200 OK\r\nX-Prev: first\r\nContent-Type: text/plain\r\nContent-Length: 1\r\n\r\nz")

// readOne reads one answer with readResponse into rs (own) or with
// http.ReadResponse.
func readOne(br *bufio.Reader, req *http.Request, rs *responseSlot, own bool) (*http.Response, error) {
	if own {
		return readResponse(br, req, rs)
	}
	return http.ReadResponse(br, req)
}

// chunkReader hands out data at most n bytes per Read, as a socket may.
type chunkReader struct {
	data []byte
	n    int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), r.n, len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

// compareRead fails unless readResponse gives what http.ReadResponse gives
// on data: the same error or the same answer, body and rest of the stream.
// chunk > 0 delivers data that many bytes per read.
func compareRead(t *testing.T, data []byte, method string, chunk int) readResult {
	t.Helper()
	got, want := readWith(data, method, true, chunk), readWith(data, method, false, chunk)
	if (got.err == nil) != (want.err == nil) || (got.err != nil && got.err.Error() != want.err.Error()) {
		t.Fatalf("%q: error %v, ReadResponse %v", data, got.err, want.err)
	}
	if got.err != nil {
		return got
	}
	g, w := *got.resp, *want.resp
	if g.Status != w.Status || g.StatusCode != w.StatusCode || g.Proto != w.Proto ||
		g.ProtoMajor != w.ProtoMajor || g.ProtoMinor != w.ProtoMinor ||
		g.ContentLength != w.ContentLength || g.Close != w.Close || g.Uncompressed != w.Uncompressed ||
		!reflect.DeepEqual(g.TransferEncoding, w.TransferEncoding) || !reflect.DeepEqual(g.Trailer, w.Trailer) ||
		!reflect.DeepEqual(g.Header, w.Header) || (g.Body == http.NoBody) != (w.Body == http.NoBody) {
		t.Fatalf("%q:\n got %+v\nwant %+v", data, g, w)
	}
	if !bytes.Equal(got.body, want.body) || errString(got.bErr) != errString(want.bErr) || !bytes.Equal(got.rest, want.rest) {
		t.Fatalf("%q: body %q (%v) rest %q, ReadResponse %q (%v) rest %q",
			data, got.body, got.bErr, got.rest, want.body, want.bErr, want.rest)
	}
	return got
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

var readHeadSeeds = []string{
	"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nDate: Mon, 30 Nov 2026 10:00:00 GMT\r\n\r\nhelloGET",
	"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
	"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\nSet-Cookie: a=1\r\nset-cookie: b=2\r\nX-Odd_Name: \t v \t\r\n\r\nabc",
	"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nab",
	"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\nContent-Length: 005\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTrailer: X\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello",
	"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
	"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\n Content-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n folded\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length : 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\nX: y\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nX: a\rb\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nX: caf\xc3\xa9\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nX: \x00\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\n: empty\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nNoColon\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1  200 OK\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 20x OK\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 2000 OK\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 999 Whatever\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\n\r\nbody until close",
	"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nbody until close",
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n",
	"HTTP/1.1 200 O",
	"",
	"HTTP/1.1 200 OK\r\nContent-Length: 999999999999999999\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: 9999999999999999999\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\nx",
}

// FuzzReadResponse holds readResponse to http.ReadResponse: on any input,
// for a GET and a HEAD, the same error or the same answer (status, proto,
// header map, length, close, trailers), the same body and the same bytes
// left for the next answer.
func FuzzReadResponse(f *testing.F) {
	for _, s := range readHeadSeeds {
		f.Add([]byte(s), false)
	}
	f.Add([]byte(readHeadSeeds[0]), true)
	f.Fuzz(func(t *testing.T, data []byte, head bool) {
		method := http.MethodGet
		if head {
			method = http.MethodHead
		}
		compareRead(t, data, method, 0)
		// Behind another answer, on one reader and one slot.
		got, want := readAfter(prevAnswer, data, method, true, 0), readAfter(prevAnswer, data, method, false, 0)
		if errString(got.err) != errString(want.err) {
			t.Fatalf("%q after an answer: error %v, ReadResponse %v", data, got.err, want.err)
		}
		if got.err == nil && (got.resp.StatusCode != want.resp.StatusCode || !reflect.DeepEqual(got.resp.Header, want.resp.Header) ||
			got.resp.ContentLength != want.resp.ContentLength || !bytes.Equal(got.body, want.body) || !bytes.Equal(got.rest, want.rest)) {
			t.Fatalf("%q after an answer:\n got %+v %q\nwant %+v %q", data, got.resp, got.body, want.resp, want.body)
		}
		// The same bytes arriving in pieces (the last input byte sets
		// their size): a head split across reads is ReadResponse's.
		if len(data) > 0 {
			compareRead(t, data, method, 1+int(data[len(data)-1])%64)
		}
	})
}

// The subset readResponse parses itself is the common answer; everything
// that changes framing, reuse or the header map is ReadResponse's, and the
// two agree on all of it (FuzzReadResponse runs the same seeds).
func TestReadResponseSubset(t *testing.T) {
	for i, s := range readHeadSeeds {
		r := compareRead(t, []byte(s), http.MethodGet, 0)
		want := i <= 4 || i == 8 || i == 29 || i == 35
		if r.taken != want {
			t.Errorf("%q: parsed itself %v, want %v", s, r.taken, want)
		}
	}
	// A head split across reads is ReadResponse's; one whose first read
	// holds it whole is parsed, the body read in pieces.
	if r := compareRead(t, []byte(readHeadSeeds[0]), http.MethodGet, 20); r.taken {
		t.Errorf("a head split across reads was parsed by readResponse")
	}
	if r := compareRead(t, []byte(readHeadSeeds[0]), http.MethodGet, 130); !r.taken || string(r.body) != "hello" {
		t.Errorf("head in the first read: parsed itself %v, body %q", r.taken, r.body)
	}
	// A HEAD request's answer is always ReadResponse's.
	if r := compareRead(t, []byte(readHeadSeeds[0]), http.MethodHead, 0); r.taken {
		t.Errorf("HEAD answer parsed by readResponse")
	}
	// A head that is not all buffered yet is ReadResponse's too, and read
	// whole.
	big := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Big: " + strings.Repeat("b", 5000) + "\r\n\r\nok"
	if r := compareRead(t, []byte(big), http.MethodGet, 0); r.taken || string(r.body) != "ok" {
		t.Errorf("large head: parsed itself %v, body %q", r.taken, r.body)
	}
}

// The slot's header map is reused by the next exchange: it must start
// empty, and the value slices an earlier answer handed out stay as they
// were.
func TestReadResponseSlotReuse(t *testing.T) {
	var rs responseSlot
	read := func(s string) *http.Response {
		br := bufio.NewReaderSize(strings.NewReader(s), 4<<10)
		resp, err := readResponse(br, &http.Request{Method: http.MethodGet}, &rs)
		if err != nil || resp != &rs.resp {
			t.Fatalf("%q: %v (parsed itself: %v)", s, err, resp == &rs.resp)
		}
		return resp
	}
	first := read("HTTP/1.1 200 OK\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n")
	kept := first.Header["X-A"]
	second := read("HTTP/1.1 201 Created\r\nX-B: 2\r\nContent-Length: 0\r\n\r\n")
	if _, ok := second.Header["X-A"]; ok || second.Header.Get("X-B") != "2" || second.StatusCode != 201 {
		t.Fatalf("second answer's header %v, status %d", second.Header, second.StatusCode)
	}
	if len(kept) != 1 || kept[0] != "1" {
		t.Fatalf("the first answer's values became %q", kept)
	}
}

// BenchmarkReadResponse is the bench upstream's small answer read by
// readResponse (own) and by http.ReadResponse (stdlib).
func BenchmarkReadResponse(b *testing.B) {
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\nDate: Mon, 30 Nov 2026 10:00:00 GMT\r\n\r\n" + strings.Repeat("s", 100))
	req := &http.Request{Method: http.MethodGet}
	for _, own := range []bool{true, false} {
		name := "stdlib"
		if own {
			name = "own"
		}
		b.Run(name, func(b *testing.B) {
			src := bytes.NewReader(answer)
			br := bufio.NewReaderSize(src, 4<<10)
			var rs responseSlot
			buf := make([]byte, 256)
			b.ReportAllocs()
			for b.Loop() {
				src.Reset(answer)
				br.Reset(src)
				resp, err := readOne(br, req, &rs, own)
				if err != nil {
					b.Fatal(err)
				}
				if n, _ := io.ReadFull(resp.Body, buf[:100]); n != 100 {
					b.Fatal(n)
				}
			}
		})
	}
}
