package courier

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"
)

// Started by go test (no launcher), the process is a job of one whose exchange works.
func TestJobOfOneExchange(t *testing.T) {
	if os.Getenv("COURIER_RUN_FD") != "" || os.Getenv("PMIX_NAMESPACE") != "" {
		t.Skip("SKIPPED: run under a launcher; this test is about a job of one")
	}
	j, err := InitJob()
	if err != nil {
		t.Fatal(err)
	}
	if j.Rank() != 0 || j.Size() != 1 || j.LocalSize() != 1 || j.Launcher() != "single" {
		t.Fatalf("rank %d size %d local size %d launcher %q", j.Rank(), j.Size(), j.LocalSize(), j.Launcher())
	}
	if err := j.Put("k", []byte("value")); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Get(0, "k", time.Second); err == nil {
		t.Fatal("a key read before its commit")
	}
	if err := j.Fence(time.Second); err != nil {
		t.Fatal(err)
	}
	v, err := j.Get(0, "k", time.Second)
	if err != nil || !bytes.Equal(v, []byte("value")) {
		t.Fatalf("got %q, %v", v, err)
	}
	if _, err := j.Get(1, "k", time.Second); !errors.Is(err, ErrInvalidParam) {
		t.Fatalf("rank 1 of a job of one: %v", err)
	}
	k1, err := j.AuthKey()
	if err != nil || k1 == ([32]byte{}) {
		t.Fatalf("auth key %x, %v", k1, err)
	}
	if err := j.Barrier(time.Second); err != nil {
		t.Fatal(err)
	}
}
