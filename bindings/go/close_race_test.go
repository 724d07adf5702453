package courier

import (
	"errors"
	"runtime"
	"sync"
	"testing"
)

// Closing an endpoint while other goroutines call it (a net.Conn's Close racing its Read
// and Write) must neither free the library's endpoint under a call nor lose the close:
// calls made after Close fail as closed, and the endpoint is released once the last call
// under way returns. Before the endpoint counted its calls, this crashed the process now
// and then (a freed handle read inside courier_ep_stream_recv).
func TestCloseRacesCalls(t *testing.T) {
	a, b, _ := pair(t)
	rounds := 150
	if testing.Short() {
		rounds = 30
	}
	for r := 0; r < rounds; r++ {
		ep := dial(t, a, b)
		start := make(chan struct{})
		var wg sync.WaitGroup
		var after sync.Map // goroutine -> error seen after it started failing
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				buf := make([]byte, 64)
				<-start
				for i := 0; ; i++ {
					var err error
					var req *Request
					if g%2 == 0 {
						req, err = ep.RecvStream(buf, false, nil)
					} else {
						req, err = ep.SendTag(buf[:8], 99, nil)
					}
					if err != nil {
						after.Store(g, err)
						return
					}
					_ = req
					if i%8 == 0 {
						runtime.Gosched()
					}
				}
			}(g)
		}
		close(start)
		runtime.Gosched()
		if err := ep.CloseForce(); err != nil {
			t.Fatalf("round %d: CloseForce: %v", r, err)
		}
		wg.Wait()
		for g := 0; g < 4; g++ {
			v, ok := after.Load(g)
			if !ok {
				t.Fatalf("round %d: goroutine %d stopped without an error", r, g)
			}
			if err := v.(error); err.Error() != errClosed("endpoint").Error() {
				// A call that began before the close may also fail because the
				// endpoint went away under it; anything else is a bug.
				if !isCanceledOrClosed(err) {
					t.Fatalf("round %d: goroutine %d: %v", r, g, err)
				}
			}
		}
		if !ep.released.Load() {
			t.Fatalf("round %d: the endpoint was not released after its last call", r)
		}
		if err := ep.enter(); err == nil {
			t.Fatalf("round %d: a call started after Close", r)
		}
	}
}

// isCanceledOrClosed: the error of a call that met an endpoint closing under it.
func isCanceledOrClosed(err error) bool {
	return errors.Is(err, ErrCanceled) || errors.Is(err, ErrEndpointClosed)
}
