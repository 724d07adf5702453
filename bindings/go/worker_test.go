package courier

import (
	"runtime"
	"testing"
	"time"
)

// Progress yields every few milliseconds also when each call delivers dozens of events
// whose handlers take a while: the runtime must see the goroutine pass through the
// scheduler well before its 10 ms preemption, which would otherwise catch it in a C call
// (a rendezvous handler's ReceiveData copying) and hand its processor away. Here 1000
// messages wait when the progressing starts and arrive about 32 per call, each handler busy
// for 20 µs: counted by calls alone, the clock would not be read once in those 20 ms.
func TestProgressYieldsBetweenBusyHandlers(t *testing.T) {
	c := newContext(t)
	a := newWorker(t, c, ThreadModeMulti)
	b := newWorker(t, c, ThreadModeMulti)
	stopA, stopB := progress(a), progress(b)
	t.Cleanup(func() {
		stopA()
		stopB()
		a.Close()
		b.Close()
	})
	ep := dial(t, a, b)
	t.Cleanup(func() { ep.CloseForce() })
	stopB() // b is progressed here from now on
	const n = 1000
	const busy = 20 * time.Microsecond
	got := 0
	if err := b.SetAMHandler(1, func(m *AMMessage) {
		got++
		for start := time.Now(); time.Since(start) < busy; {
		}
	}); err != nil {
		t.Fatal(err)
	}
	var reqs []*Request
	for i := 0; i < n; i++ {
		r, err := ep.SendAM(1, nil, []byte("message"), 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r != nil {
			reqs = append(reqs, r) // b's queue is full: a sends it as b drains it
		}
	}
	calls, yields := 0, 0
	last := b.lastYield.Load()
	start := time.Now()
	for got < n {
		b.Progress()
		calls++
		if y := b.lastYield.Load(); y != last {
			last = y
			yields++
		}
		if time.Since(start) > testTimeout {
			t.Fatalf("%d of %d messages after %v", got, n, testTimeout)
		}
	}
	took := time.Since(start)
	t.Logf("%d messages in %d progress calls, %v, %d yields (%d sends queued)", n, calls, took, yields, len(reqs))
	for _, r := range reqs {
		wait(t, r)
	}
	if want := int(took/(2*yieldEvery)) - 1; yields < want || yields < 2 {
		t.Fatalf("%d yields in %v of handlers (%d progress calls); want at least %d", yields, took, calls, max(want, 2))
	}
}

// TestTwoWorkersOfOneGoroutineConnectOverShm drives two single-thread workers from one
// goroutine, as an event loop does: the shared-memory setup between them must not wait for
// an acceptor only this goroutine runs (it used to block 5 s and end on tcp).
func TestTwoWorkersOfOneGoroutineConnectOverShm(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p := (&ContextParams{}).EnableAM().SetName(t.Name()).SetConfig("COURIER_TLS", "shm,tcp")
	c, err := NewContext(p)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a := newWorker(t, c, ThreadModeSingle)
	defer a.Close()
	b := newWorker(t, c, ThreadModeSingle)
	defer b.Close()
	got := 0
	if err := b.SetAMHandler(5, func(m *AMMessage) {
		if string(m.Data) == "hello" {
			got++
		}
	}); err != nil {
		t.Fatal(err)
	}
	addr, err := b.Address()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ep, err := a.NewEndpoint((&EndpointParams{}).SetWorkerAddress(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer ep.CloseForce()
	if _, err := ep.SendAM(5, nil, []byte("hello"), 0, nil); err != nil {
		t.Fatal(err)
	}
	for got == 0 {
		if time.Since(start) > 2*time.Second {
			t.Fatalf("not delivered within 2 s (transport %q)", ep.Transport())
		}
		a.Progress()
		b.Progress()
	}
	if tr := ep.Transport(); tr != "shm" {
		t.Fatalf("transport %q, want shm", tr)
	}
}
