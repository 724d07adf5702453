package courier

import (
	"context"
	"errors"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// threadCPU is the CPU time the calling OS thread has used (the caller holds its thread).
func threadCPU(t *testing.T) time.Duration {
	t.Helper()
	const rusageThread = 1 // RUSAGE_THREAD, Linux
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Progress yields every few milliseconds also when each call delivers dozens of events
// whose handlers take a while: the runtime must see the goroutine pass through the
// scheduler well before its 10 ms preemption, which would otherwise catch it in a C call
// (a rendezvous handler's ReceiveData copying) and hand its processor away. Here 1000
// messages wait when the progressing starts and arrive about 32 per call, each handler busy
// for 20 µs: counted by calls alone, the clock would not be read once in those 20 ms.
// The yields are counted against the CPU time the progressing thread got, not the wall
// time: on a crowded machine the thread waits for a CPU between its stretches of work.
func TestProgressYieldsBetweenBusyHandlers(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	a, b, _, stopB := progressedPair(t)
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
	start, cpu0 := time.Now(), threadCPU(t)
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
	took, cpu := time.Since(start), threadCPU(t)-cpu0
	t.Logf("%d messages in %d progress calls, %v (%v on the CPU), %d yields (%d sends queued)", n, calls, took, cpu, yields, len(reqs))
	for _, r := range reqs {
		wait(t, r)
	}
	if want := int(cpu/(2*yieldEvery)) - 1; yields < want || yields < 2 {
		t.Fatalf("%d yields in %v on the CPU of handlers (%d progress calls); want at least %d", yields, cpu, calls, max(want, 2))
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

// Close from a handler that runs inside the library (a message sent with AMReply) while a
// progress call is on the stack: new calls fail as closed at once, and the worker is
// destroyed when that progress call returns (destroying it at once crashed the process).
func TestCloseWorkerInsideHandler(t *testing.T) {
	c := newContext(t)
	a := newWorker(t, c, ThreadModeMulti)
	t.Cleanup(func() { a.Close() })
	for _, flags := range []AMFlags{AMReply, 0} {
		b := newWorker(t, c, ThreadModeMulti)
		addr, err := b.Address()
		if err != nil {
			t.Fatal(err)
		}
		ep, err := a.NewEndpoint((&EndpointParams{}).SetWorkerAddress(addr))
		if err != nil {
			t.Fatal(err)
		}
		ran := false
		var inHandler []error
		if err := b.SetAMHandler(1, func(m *AMMessage) {
			ran = true
			inHandler = append(inHandler, b.Close(), b.Close())
			_, err := b.Address()
			inHandler = append(inHandler, err)
			if b.destroyed.Load() {
				inHandler = append(inHandler, errors.New("destroyed inside the handler"))
			}
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := ep.SendAM(1, nil, []byte("x"), flags, nil); err != nil {
			t.Fatal(err)
		}
		for start := time.Now(); !ran; {
			if time.Since(start) > testTimeout {
				t.Fatalf("flags %v: handler did not run", flags)
			}
			a.Progress()
			b.Progress()
		}
		if len(inHandler) != 3 || inHandler[0] != nil || inHandler[1] != nil ||
			inHandler[2] == nil || inHandler[2].Error() != errClosed("worker").Error() {
			t.Fatalf("flags %v: in the handler: Close, Close, Address: %v", flags, inHandler)
		}
		if !b.destroyed.Load() {
			t.Fatalf("flags %v: not destroyed after the progress call returned", flags)
		}
		if b.Progress() != 0 {
			t.Fatal("Progress after Close")
		}
		if _, err := b.Address(); err == nil || err.Error() != errClosed("worker").Error() {
			t.Fatalf("Address after Close: %v", err)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		ep.CloseForce()
	}
}

// Every operation on an endpoint whose worker is closed fails as closed at once (they were
// accepted and never completed, as nothing progresses a closed worker).
func TestEndpointAfterWorkerClose(t *testing.T) {
	c := newContext(t)
	a := newWorker(t, c, ThreadModeMulti)
	b := newWorker(t, c, ThreadModeMulti)
	stopB := progress(b)
	t.Cleanup(func() {
		stopB()
		b.Close()
	})
	ep := dial(t, a, b)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	closed := errClosed("worker").Error()
	check := func(what string, r *Request, err error) {
		t.Helper()
		if r != nil || err == nil || err.Error() != closed {
			t.Fatalf("%s after the worker closed: %v, %v", what, r, err)
		}
	}
	r, err := ep.SendTag(make([]byte, 16), 1, nil)
	check("small SendTag", r, err)
	r, err = ep.SendTag(make([]byte, 100000), 1, nil)
	check("large SendTag", r, err)
	r, err = ep.SendAM(1, nil, make([]byte, 100000), AMRndv, nil)
	check("SendAM", r, err)
	r, err = ep.SendStream([]byte("x"), nil)
	check("SendStream", r, err)
	r, err = ep.RecvStream(make([]byte, 10), false, nil)
	check("RecvStream", r, err)
	check("Flush", nil, ep.Flush())
	check("WaitConnected", nil, ep.WaitConnected(time.Second))
	if _, err := ep.Connected(); err == nil || err.Error() != closed {
		t.Fatalf("Connected after the worker closed: %v", err)
	}
	if err := ep.Close(); err != nil && !errors.Is(err, ErrPeerFailure) && !errors.Is(err, ErrEndpointClosed) {
		t.Fatalf("endpoint Close after the worker closed: %v", err)
	}
}

// A request still in flight when its worker closes completes then, with ErrCanceled: Done
// is closed, Err says why, its callback ran, and Wait returns (it spun forever before).
func TestPendingRequestCompletesAtWorkerClose(t *testing.T) {
	c := newContext(t)
	for _, mode := range []ThreadMode{ThreadModeSingle, ThreadModeMulti} {
		runtime.LockOSThread()
		w := newWorker(t, c, mode)
		var cbErr error
		calls := 0
		r, err := w.RecvTag(make([]byte, 64), 1, ^uint64(0), func(_ Info, err error) { calls++; cbErr = err })
		if err != nil || r == nil {
			t.Fatalf("RecvTag: %v, %v", r, err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-r.Done():
		default:
			t.Fatalf("mode %v: Done not closed after the worker closed", mode)
		}
		if !errors.Is(r.Err(), ErrCanceled) || calls != 1 || !errors.Is(cbErr, ErrCanceled) {
			t.Fatalf("mode %v: Err %v, callback ran %d times with %v", mode, r.Err(), calls, cbErr)
		}
		if err := r.Wait(context.Background()); !errors.Is(err, ErrCanceled) {
			t.Fatalf("mode %v: Wait: %v", mode, err)
		}
		if err := r.Cancel(); err != nil {
			t.Fatalf("mode %v: Cancel of a completed request: %v", mode, err)
		}
		runtime.UnlockOSThread()
	}
}
