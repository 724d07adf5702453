package courier

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	mockOnce sync.Once
	mockLib  string
	mockErr  error
)

// cudaDriver builds the stand-in CUDA driver the library's tests use
// (crates/courier/tests/mockcuda): its device memory faults on any CPU access, so a byte
// the binding or the library moved without the driver would crash the test. With
// COURIER_TEST_CUDA=real the machine's own driver and GPU are used instead.
func cudaDriver(t *testing.T) string {
	t.Helper()
	if os.Getenv("COURIER_TEST_CUDA") == "real" {
		return "libcuda.so.1"
	}
	mockOnce.Do(func() {
		dir, err := os.MkdirTemp("", "courier-go-mockcuda")
		if err != nil {
			mockErr = err
			return
		}
		mockLib = filepath.Join(dir, "libcuda.so.1")
		src := filepath.Join("..", "..", "crates", "courier", "tests", "mockcuda", "mockcuda.c")
		out, err := exec.Command("cc", "-shared", "-fPIC", "-O1", "-o", mockLib, src, "-lpthread").CombinedOutput()
		if err != nil {
			mockErr = &Error{Status: ErrIO, Detail: "building the stand-in CUDA driver: " + err.Error() + ": " + string(out)}
		}
	})
	if mockErr != nil {
		t.Fatal(mockErr)
	}
	return mockLib
}

// TestDeviceMemory sends tag messages between host and CUDA device memory both ways, small
// (the binding must not copy device memory into its slot) and large (rendezvous).
func TestDeviceMemory(t *testing.T) {
	lib := cudaDriver(t)
	p := (&ContextParams{}).EnableTag().EnableRMA().SetName(t.Name()).SetConfig("COURIER_CUDA_LIB", lib)
	c, err := NewContext(p)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, b := newWorker(t, c, ThreadModeMulti), newWorker(t, c, ThreadModeMulti)
	stopA, stopB := progress(a), progress(b)
	defer func() { stopA(); stopB(); a.Close(); b.Close() }()
	ep := dial(t, a, b)
	defer ep.CloseForce()
	ctx := context.Background()
	send := func(data []byte, tag uint64) {
		t.Helper()
		r, err := ep.SendTag(data, tag, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	recv := func(buf []byte, tag uint64) *Request {
		t.Helper()
		r, err := b.RecvTag(buf, tag, ^uint64(0), nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, n := range []int{100, 1<<20 + 3} {
		m1, err := c.MemMap(&MemMapParams{Alloc: true, Length: n, MemoryType: MemoryTypeCuda})
		if err != nil {
			t.Fatal(err)
		}
		m2, err := c.MemMap((&MemMapParams{}).Allocate().SetLength(n).SetMemoryType(MemoryTypeCuda))
		if err != nil {
			t.Fatal(err)
		}
		if m1.Query().MemoryType != MemoryTypeCuda || m1.Bytes() != nil || len(m1.DeviceBytes()) != n {
			t.Fatalf("device region: %+v, Bytes %d, DeviceBytes %d", m1.Query(), len(m1.Bytes()), len(m1.DeviceBytes()))
		}
		want := pattern(n, 9)
		r := recv(m1.DeviceBytes(), 1)
		send(want, 1) // host to device
		wait(t, r)
		maybeGC()
		r = recv(m2.DeviceBytes(), 2)
		send(m1.DeviceBytes(), 2) // device to device
		wait(t, r)
		got := make([]byte, n)
		r = recv(got, 3)
		send(m2.DeviceBytes(), 3) // device to host
		if info := wait(t, r); info.Length != n || !bytes.Equal(got, want) {
			t.Fatalf("%d bytes through device memory came back different (%d)", n, info.Length)
		}
		m1.Close()
		m2.Close()
		if m1.DeviceBytes() != nil {
			t.Fatal("DeviceBytes after Close")
		}
	}
	host, err := c.MemMap(&MemMapParams{Alloc: true, Length: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	if host.DeviceBytes() != nil || len(host.Bytes()) != 64 {
		t.Fatal("host memory has Bytes, not DeviceBytes")
	}
}
