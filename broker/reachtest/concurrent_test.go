package reachtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	mathrand "math/rand/v2"
	"sync"
	"testing"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
)

// TestTwoClientsNoCrossDelivery: two phones on two streams of the same host
// echo distinct random payloads through /relay/ws at the same time. Every
// echo must be the phone's own message, in order: nothing of one stream
// may reach the other.
func TestTwoClientsNoCrossDelivery(t *testing.T) {
	r := startReach(t, reachOptions{})
	rounds := 60
	if raceEnabled {
		rounds = 25
	}
	type phone struct {
		ws   *websocket.Conn
		sent int
	}
	phones := make([]*phone, 2)
	for i := range phones {
		in := r.open()
		ws, authOK := in.relayWS(authFrame(map[string]string{"pairing_code": testenv.RandomSecret("pair-")}))
		parseAuthOK(t, authOK)
		phones[i] = &phone{ws: ws}
	}
	start := make(chan struct{})
	errs := make(chan error, len(phones))
	var wg sync.WaitGroup
	for i, p := range phones {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 4*step)
			defer cancel()
			for round := 0; round < rounds; round++ {
				// A header naming phone and round, then random bytes
				// (1 B .. 256 KiB), so a misdelivered or reordered
				// message is named in the error.
				msg := make([]byte, 16+1+mrand(256<<10))
				binary.BigEndian.PutUint64(msg, uint64(i))
				binary.BigEndian.PutUint64(msg[8:], uint64(round))
				rand.Read(msg[16:])
				if err := p.ws.Write(ctx, websocket.MessageBinary, msg); err != nil {
					errs <- fmt.Errorf("phone %d round %d: write: %v", i, round, err)
					return
				}
				_, got, err := p.ws.Read(ctx)
				if err != nil {
					errs <- fmt.Errorf("phone %d round %d: read: %v", i, round, err)
					return
				}
				if !bytes.Equal(got, msg) {
					from, rd := -1, -1
					if len(got) >= 16 {
						from, rd = int(binary.BigEndian.Uint64(got)), int(binary.BigEndian.Uint64(got[8:]))
					}
					errs <- fmt.Errorf("phone %d round %d got %d bytes of phone %d round %d, want its own %d bytes",
						i, round, len(got), from, rd, len(msg))
					return
				}
				p.sent += len(msg)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	if n := r.front.relay.Frames.Load(); n != int64(2+2*rounds) {
		t.Fatalf("the Relay saw %d messages, want %d", n, 2+2*rounds)
	}
	if r.front.relay.Upgrades.Load() != 2 || r.tb.B.Stats().ActiveStreams != 2 {
		t.Fatalf("%d Relay sessions, %d broker streams", r.front.relay.Upgrades.Load(), r.tb.B.Stats().ActiveStreams)
	}
	t.Logf("echoed %d and %d bytes", phones[0].sent, phones[1].sent)
}

func mrand(n int) int { return mathrand.IntN(n) }
