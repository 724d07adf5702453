package courier

import (
	"os"
	"runtime"
	"testing"
	"time"
)

// BenchmarkAMPingPong is the Go cost of the perftest's latency loop in one process: an
// 8-byte active message from worker a to worker b and one back, each side progressing
// until its handler ran. Compare runs of it before and after a change (go test -bench).
// With GO_BENCH_SELF=1 both are one worker (the self transport).
func BenchmarkAMPingPong(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c, err := NewContext((&ContextParams{}).EnableAM().SetName("bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	wa, err := c.NewWorker(nil)
	if err != nil {
		b.Fatal(err)
	}
	defer wa.Close()
	wb := wa
	if os.Getenv("GO_BENCH_SELF") == "" {
		wb, err = c.NewWorker(nil)
		if err != nil {
			b.Fatal(err)
		}
		defer wb.Close()
	}
	connect := func(from, to *Worker) *Endpoint {
		addr, err := to.Address()
		if err != nil {
			b.Fatal(err)
		}
		ep, err := from.NewEndpoint((&EndpointParams{}).SetWorkerAddress(addr))
		if err != nil {
			b.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; {
			from.Progress()
			to.Progress()
			if ok, err := ep.Connected(); err != nil {
				b.Fatal(err)
			} else if ok {
				return ep
			}
			if time.Now().After(deadline) {
				b.Fatal("not connected")
			}
		}
	}
	ab, ba := connect(wa, wb), connect(wb, wa)
	defer ab.CloseForce()
	defer ba.CloseForce()
	var gotA, gotB int
	if err := wa.SetAMHandler(1, func(*AMMessage) { gotA++ }); err != nil {
		b.Fatal(err)
	}
	if err := wb.SetAMHandler(2, func(*AMMessage) { gotB++ }); err != nil {
		b.Fatal(err)
	}
	hdr, data := make([]byte, 8), make([]byte, 8)
	sent := 0
	done := func(Info, error) { sent++ }
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := ab.SendAM(2, hdr, data, 0, done); err != nil {
			b.Fatal(err)
		}
		for gotB <= i {
			wb.Progress()
		}
		if _, err := ba.SendAM(1, hdr, data, 0, done); err != nil {
			b.Fatal(err)
		}
		for gotA <= i {
			wa.Progress()
		}
	}
}

// BenchmarkAMRndv is the Go cost of the perftest's bandwidth loop in one process: worker a
// streams rendezvous active messages (a window of 32) to worker b, whose handler receives
// each into one buffer. The messages are small (64 KiB) so that the per-message cost, not
// the copy, dominates.
func BenchmarkAMRndv(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c, err := NewContext((&ContextParams{}).EnableAM().SetName("bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	wa, err := c.NewWorker(nil)
	if err != nil {
		b.Fatal(err)
	}
	defer wa.Close()
	wb, err := c.NewWorker(nil)
	if err != nil {
		b.Fatal(err)
	}
	defer wb.Close()
	addr, err := wb.Address()
	if err != nil {
		b.Fatal(err)
	}
	ep, err := wa.NewEndpoint((&EndpointParams{}).SetWorkerAddress(addr))
	if err != nil {
		b.Fatal(err)
	}
	defer ep.CloseForce()
	for deadline := time.Now().Add(10 * time.Second); ; {
		wa.Progress()
		wb.Progress()
		if ok, err := ep.Connected(); err != nil {
			b.Fatal(err)
		} else if ok {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("not connected")
		}
	}
	const size, window = 64 << 10, 32
	src, err := c.MemMap(&MemMapParams{Alloc: true, Length: size})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	dst, err := c.MemMap(&MemMapParams{Alloc: true, Length: size})
	if err != nil {
		b.Fatal(err)
	}
	defer dst.Close()
	data, buf := src.Bytes()[:size], dst.Bytes()[:size]
	received := 0
	var failed error
	if err := wb.SetAMHandler(1, func(m *AMMessage) {
		if _, err := m.ReceiveData(buf[:m.DataLen], func(_ Info, err error) {
			if err != nil {
				failed = err
			}
			received++
		}); err != nil {
			failed = err
		}
	}); err != nil {
		b.Fatal(err)
	}
	hdr := make([]byte, 8)
	inflight := 0
	done := func(_ Info, err error) {
		inflight--
		if err != nil {
			failed = err
		}
	}
	b.SetBytes(size)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for inflight >= window {
			wa.Progress()
			wb.Progress()
		}
		inflight++
		if _, err := ep.SendAM(1, hdr, data, AMRndv, done); err != nil {
			b.Fatal(err)
		}
		wb.Progress()
		if failed != nil {
			b.Fatal(failed)
		}
	}
	for received < b.N || inflight > 0 {
		wa.Progress()
		wb.Progress()
	}
}
