package courier

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// rmaPair makes an owner and a user in separate contexts (so keys take the path a separate
// process would: shared memory, CMA, or through the owner's worker over tcp), each worker
// progressed by its own goroutine, and an endpoint from the user to the owner.
func rmaPair(t *testing.T, tls string) (ownerCtx *Context, owner *Worker, ep *Endpoint) {
	t.Helper()
	p := newRMAPair(t, tls)
	return p.ownerCtx, p.owner, p.ep
}

// rmaPeers is what newRMAPair makes: stopOwner and stopUser end the progress goroutines
// (the test then progresses the workers itself; calling them again is harmless).
type rmaPeers struct {
	ownerCtx            *Context
	owner, user         *Worker
	ep                  *Endpoint
	stopOwner, stopUser func()
}

// newRMAPair is rmaPair, with config (name, value pairs) applied to both contexts.
func newRMAPair(t *testing.T, tls string, config ...string) *rmaPeers {
	t.Helper()
	mk := func(name string) *Context {
		p := (&ContextParams{}).EnableTag().EnableStream().EnableRMA().EnableAtomics().EnableWakeup().SetName(name)
		if tls != "" {
			p.SetConfig("COURIER_TLS", tls)
		}
		for i := 0; i+1 < len(config); i += 2 {
			p.SetConfig(config[i], config[i+1])
		}
		c, err := NewContext(p)
		if err != nil {
			t.Fatalf("NewContext: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ownerCtx, userCtx := mk("owner"), mk("user")
	owner := newWorker(t, ownerCtx, ThreadModeMulti)
	user := newWorker(t, userCtx, ThreadModeMulti)
	addr, err := owner.Address()
	if err != nil {
		t.Fatal(err)
	}
	stopO, stopU := progress(owner), progress(user)
	ep, err := user.NewEndpoint((&EndpointParams{}).SetWorkerAddress(addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ep.CloseForce()
		stopU()
		stopO()
		user.Close()
		owner.Close()
	})
	if err := ep.WaitConnected(testTimeout); err != nil {
		t.Fatal(err)
	}
	return &rmaPeers{ownerCtx: ownerCtx, owner: owner, user: user, ep: ep, stopOwner: stopO, stopUser: stopU}
}

func TestOneSided(t *testing.T) { onEachTransport(t, testOneSided) }

// onEachTransport runs f as a subtest with the default transports ("") and with tcp.
func onEachTransport(t *testing.T, f func(t *testing.T, tls string)) {
	for _, tls := range []string{"", "tcp"} {
		name := tls
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) { f(t, tls) })
	}
}

func testOneSided(t *testing.T, tls string) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	oc, _, ep := rmaPair(t, tls)

	// CUDA memory: NoDevice without a driver; device memory where one is loaded (a GPU,
	// or TestDeviceMemory's stand-in driver, which stays loaded in this process).
	if m, err := oc.MemMap((&MemMapParams{}).SetMemoryType(MemoryTypeCuda).Allocate().SetLength(4096)); err == nil {
		if m.Query().MemoryType != MemoryTypeCuda {
			t.Fatalf("cuda memory: %+v", m.Query())
		}
		m.Close()
	} else if !errors.Is(err, ErrNoDevice) {
		t.Fatalf("cuda memory without a device: %v", err)
	}
	const size = 1 << 20
	mem, err := oc.MemMap((&MemMapParams{}).SetMemoryType(MemoryTypeHost).Allocate().SetLength(size).SetAccess(AccessAll))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	attr := mem.Query()
	if attr.Length != size || attr.MemoryType != MemoryTypeHost || attr.Address == 0 {
		t.Fatalf("query: %+v", attr)
	}
	region := mem.Bytes()
	packed, err := mem.PackRkey()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ep.UnpackRkey([]byte("junk")); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("junk key: %v", err)
	}
	rk, err := ep.UnpackRkey(packed)
	if err != nil {
		t.Fatal(err)
	}
	defer rk.Close()
	if b, l := rk.Bounds(); b != attr.Address || l != size {
		t.Fatalf("bounds %x+%d, want %x+%d", b, l, attr.Address, size)
	}
	t.Logf("transport %s, key path %s", ep.Transport(), rk.Path())
	base := attr.Address

	// put, fence, get
	data := pattern(64<<10, 1)
	r, err := ep.Put(data, base, rk, nil)
	if err != nil {
		t.Fatal(err)
	}
	maybeGC()
	wait(t, r)
	if err := ep.Fence(); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(data))
	if r, err = ep.Get(back, base, rk, nil); err != nil {
		t.Fatal(err)
	}
	wait(t, r)
	if !bytes.Equal(back, data) {
		t.Fatal("get returned other bytes than were put")
	}

	// fetching atomics: the old value comes back in Info.Value
	fetch := func(r *Request, err error) uint64 {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return wait(t, r).Value
	}
	if v := fetch(ep.Atomic(AtomicAdd, 5, 0, base+size-64, rk, nil)); v != 0 {
		t.Fatalf("first fetch-add returned %d", v)
	}
	if v := fetch(ep.Atomic(AtomicAdd, 7, 0, base+size-64, rk, nil)); v != 5 {
		t.Fatalf("second fetch-add returned %d", v)
	}
	if v := fetch(ep.Atomic32(AtomicCswap, 0xabcd, 0, base+size-56, rk, nil)); v != 0 {
		t.Fatalf("cswap32 returned %d", v)
	}
	if _, err := ep.Atomic(AtomicAdd, 1, 0, base+3, rk, nil); !errors.Is(err, ErrInvalidParam) {
		t.Fatalf("unaligned atomic: %v", err)
	}
	// posted atomics: nothing comes back; Flush confirms them (the owner's worker carries
	// them out over tcp; over shared memory they are done at once)
	for i := 0; i < 50; i++ {
		if err := ep.AtomicPost(AtomicAdd, 3, base+size-48, rk); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []struct {
		op AtomicOp
		v  uint32
	}{{AtomicOr, 0xf0f0f0f0}, {AtomicXor, 0xffff0000}, {AtomicAnd, 0xff0ff0ff}} {
		if err := ep.AtomicPost32(p.op, p.v, base+size-40, rk); err != nil {
			t.Fatal(err)
		}
	}
	if err := ep.Flush(); err != nil {
		t.Fatal(err)
	}
	if v := binary.LittleEndian.Uint64(region[size-48:]); v != 150 {
		t.Fatalf("posted adds: %d, want 150", v)
	}
	if v := binary.LittleEndian.Uint32(region[size-40:]); v != (0xf0f0f0f0^0xffff0000)&0xff0ff0ff {
		t.Fatalf("posted or, xor, and: %#x", v)
	}
	if err := ep.AtomicPost(AtomicSwap, 1, base+size-48, rk); !errors.Is(err, ErrInvalidParam) {
		t.Fatalf("posted swap: %v", err)
	}
	// Refused at once, on completion, or (puts the target carries out complete locally,
	// like OpenSHMEM's) by the next flush.
	if r, err := ep.Put(data[:16], base+size-8, rk, nil); err == nil {
		<-r.Done()
		err = r.Err()
		if err == nil {
			err = ep.Flush()
		}
		if !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("put past the end: %v", err)
		}
	} else if !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("put past the end: %v", err)
	}

	// put with signal; the owner waits on the word (its worker progressed elsewhere)
	data2 := pattern(64<<10, 2)
	if r, err = ep.PutSignal(data2, base+256<<10, rk, base+size-8, rk, 1, SignalAdd, nil); err != nil {
		t.Fatal(err)
	}
	v, err := mem.SignalWaitUntil(ctx, nil, size-8, CmpGE, 1)
	if err != nil || v != 1 {
		t.Fatalf("signal wait: %d, %v", v, err)
	}
	wait(t, r)
	if !bytes.Equal(region[256<<10:256<<10+len(data2)], data2) || !bytes.Equal(region[:len(data)], data) {
		t.Fatal("owner sees other bytes than were put")
	}
	if got, _ := mem.SignalFetch(size - 8); got != 1 {
		t.Fatalf("signal word %d", got)
	}

	// a registered Go buffer
	gobuf := make([]byte, 8192)
	reg, err := oc.MemMap((&MemMapParams{}).SetBuffer(gobuf))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	rpacked, err := reg.PackRkey()
	if err != nil {
		t.Fatal(err)
	}
	rrk := unpackKey(t, ep, rpacked)
	if r, err = ep.Put(data[:4096], reg.Query().Address+100, rrk, nil); err != nil {
		t.Fatal(err)
	}
	wait(t, r)
	if err := ep.Flush(); err != nil { // puts complete locally; flush completes them remotely
		t.Fatal(err)
	}
	if !bytes.Equal(gobuf[100:4196], data[:4096]) {
		t.Fatal("registered buffer not written")
	}

	// a semaphore posted remotely
	sem, saddr, srk := remoteSemaphore(t, oc, ep, 0)
	if sem.TryWait(1) {
		t.Fatal("took from an empty semaphore")
	}
	fetch(ep.Atomic(AtomicAdd, 2, 0, saddr, srk, nil))
	if err := sem.Wait(ctx, nil, 1); err != nil {
		t.Fatal(err)
	}
	if sem.Value() != 1 {
		t.Fatalf("semaphore value %d", sem.Value())
	}
	if err := sem.Post(1); err != nil || !sem.TryWait(2) {
		t.Fatalf("post/try: %v", err)
	}
	if _, err := oc.NewSemaphore(SemBoolean | SemInteger); !errors.Is(err, ErrInvalidParam) {
		t.Fatalf("bad semaphore flags: %v", err)
	}
	// a wait that cannot succeed ends with its context
	short, cancel2 := context.WithTimeout(ctx, 20e6)
	defer cancel2()
	if _, err := mem.SignalWaitUntil(short, nil, size-8, CmpEQ, 99); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait with a deadline: %v", err)
	}
}

// cpuTime is the CPU time the whole process has used.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestSleepingWaits: with WaitSleep, SignalWaitUntil and Semaphore.Wait on a worker nobody
// else progresses sleep until a peer's put-with-signal arrives, instead of spinning for
// it: the process uses well under half a CPU while they wait. They also end with their
// context, and without a worker they nap.
func TestSleepingWaits(t *testing.T) { onEachTransport(t, testSleepingWaits) }

func testSleepingWaits(t *testing.T, tls string) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	p := newRMAPair(t, tls)
	const size = 4096
	mem, err := p.ownerCtx.MemMap((&MemMapParams{}).SetMemoryType(MemoryTypeHost).Allocate().SetLength(size).SetAccess(AccessAll))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	base := mem.Query().Address
	packed, err := mem.PackRkey()
	if err != nil {
		t.Fatal(err)
	}
	rk := unpackKey(t, p.ep, packed)
	sem, saddr, srk := remoteSemaphore(t, p.ownerCtx, p.ep, 0)

	// From here the waits progress the owner's worker; the user's sends leave inside the
	// calls (small, eager), so no goroutine spins while the owner waits.
	p.stopOwner()
	p.stopUser()
	const delay = 300 * time.Millisecond
	putLater := func(data []byte, sigAddr uint64, sigKey *RemoteKey) <-chan error {
		done := make(chan error, 1)
		go func() {
			time.Sleep(delay)
			r, err := p.ep.PutSignal(data, base, rk, sigAddr, sigKey, 1, SignalAdd, nil)
			if err == nil {
				err = r.Wait(ctx)
			}
			// Over tcp, a frame that follows another with no progress between them
			// waits in the link's coalescing queue for the next progress call.
			p.user.Progress()
			done <- err
		}()
		return done
	}
	// sleeping takes: runs wait while a put-with-signal arrives after delay, and checks
	// that the process slept through most of it.
	sleeping := func(what string, data []byte, sigAddr uint64, sigKey *RemoteKey, wait func() error) {
		t.Helper()
		cpu0, t0 := cpuTime(t), time.Now()
		done := putLater(data, sigAddr, sigKey)
		if err := wait(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		wall, cpu := time.Since(t0), cpuTime(t)-cpu0
		if err := <-done; err != nil {
			t.Fatalf("%s: the put: %v", what, err)
		}
		if wall < delay {
			t.Fatalf("%s ended after %v, before the put (%v)", what, wall, delay)
		}
		if !bytes.Equal(mem.Bytes()[:len(data)], data) {
			t.Fatalf("%s: the put's data is not there when its signal is", what)
		}
		t.Logf("%s: %v of CPU in %v", what, cpu, wall)
		if cpu > wall/2 {
			t.Fatalf("%s used %v of CPU in %v: it spun instead of sleeping", what, cpu, wall)
		}
	}
	sleeping("signal wait", pattern(256, 5), base+size-8, rk, func() error {
		v, err := mem.SignalWaitUntil(ctx, p.owner, size-8, CmpGE, 1, WaitSleep)
		if err == nil && v != 1 {
			err = fmt.Errorf("woke with the word at %d", v)
		}
		return err
	})
	sleeping("semaphore wait", pattern(256, 6), saddr, srk, func() error {
		return sem.Wait(ctx, p.owner, 1, WaitSleep)
	})
	if sem.Value() != 0 {
		t.Fatalf("semaphore at %d after the wait took the post", sem.Value())
	}

	// A wait that cannot succeed ends with its context: canceled, or at its deadline.
	short, cancelShort := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancelShort)
	t0 := time.Now()
	if _, err := mem.SignalWaitUntil(short, p.owner, size-8, CmpEQ, 99, WaitSleep); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled sleeping wait: %v", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("canceled sleeping wait returned after %v", d)
	}
	dl, cancelDl := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancelDl()
	if err := sem.Wait(dl, p.owner, 1, WaitSleep); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("sleeping semaphore wait past its deadline: %v", err)
	}
	// Without a worker there is no event fd to sleep on: it naps, and a local post ends it.
	time.AfterFunc(20*time.Millisecond, func() { _ = sem.Post(2) })
	if err := sem.Wait(ctx, nil, 2, WaitSleep); err != nil {
		t.Fatalf("napping semaphore wait: %v", err)
	}
	bsem, err := p.ownerCtx.NewSemaphore(SemBoolean)
	if err != nil {
		t.Fatal(err)
	}
	defer bsem.Close()
	if err := bsem.Wait(ctx, p.owner, 2, WaitSleep); !errors.Is(err, ErrInvalidParam) {
		t.Fatalf("a wait for 2 on a boolean semaphore: %v", err)
	}
}

// unpackKey unpacks a packed key on ep, failing the test on error; the key is released
// when the test ends.
func unpackKey(t *testing.T, ep *Endpoint, packed []byte) *RemoteKey {
	t.Helper()
	rk, err := ep.UnpackRkey(packed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rk.Close() })
	return rk
}

// remoteSemaphore makes a semaphore on c and unpacks its key on ep: the semaphore, the
// address a peer's atomics or signals go to, and the key for them. Both are released
// when the test ends.
func remoteSemaphore(t *testing.T, c *Context, ep *Endpoint, flags SemFlags) (*Semaphore, uint64, *RemoteKey) {
	t.Helper()
	sem, err := c.NewSemaphore(flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sem.Close() })
	skey, saddr, err := sem.Remote()
	if err != nil {
		t.Fatal(err)
	}
	return sem, saddr, unpackKey(t, ep, skey)
}

// Buffers in host memory the library allocated are C memory: operations on them pin
// nothing (and make no Request for it); Go memory, registered or not, is pinned; a region
// stops counting as library memory once closed.
func TestPinningSkipsLibraryAllocatedMemory(t *testing.T) {
	c := newContext(t)
	w := newWorker(t, c, ThreadModeSingle)
	defer w.Close()
	alloc, err := c.MemMap(&MemMapParams{Alloc: true, Length: 1 << 16})
	if err != nil {
		t.Fatalf("MemMap alloc: %v", err)
	}
	goBuf := make([]byte, 1<<16)
	reg, err := c.MemMap(&MemMapParams{Buffer: goBuf})
	if err != nil {
		t.Fatalf("MemMap register: %v", err)
	}
	defer reg.Close()
	pinned := func(b []byte) bool {
		t.Helper()
		o, err := w.newOp(nil)
		if err != nil {
			t.Fatalf("newOp: %v", err)
		}
		defer w.slab.put(o.sl)
		o.pin(b)
		if o.r == nil {
			return false
		}
		p := o.r.pinner != nil
		o.r.unpin()
		return p
	}
	if pinned(alloc.Bytes()[100:200]) {
		t.Error("a slice of library-allocated host memory was pinned")
	}
	if !pinned(reg.Bytes()) {
		t.Error("a registered Go buffer was not pinned for the operation")
	}
	if !pinned(make([]byte, 64)) {
		t.Error("a Go buffer was not pinned")
	}
	addr := alloc.Query().Address
	if err := alloc.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, r := range rangesOf(&hostAllocs) {
		if r[0] == addr {
			t.Errorf("closed region %#x still listed as library memory", addr)
		}
	}
}

func rangesOf(d *memRanges) [][2]uint64 {
	if r := d.snap.Load(); r != nil {
		return *r
	}
	return nil
}
