// Command jobring is a Courier job in Go: rank and size from whichever launcher started it
// (courier run, mpirun, srun, hydra; none = a job of one), a ring exchange over endpoints
// made on first use, then an all-to-all after connecting to every rank, every byte checked.
//
//	courier run -n 4 jobring        mpirun -n 4 jobring        jobring
package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"time"

	"courier.dev/courier"
)

const msgLen = 4096

func pattern(src, dst uint32, salt byte) []byte {
	b := make([]byte, msgLen)
	for i := range b {
		b[i] = byte(int(src)*131+int(dst)*7+i*31) ^ salt
	}
	return b
}

func run() error {
	job, err := courier.InitJob()
	if err != nil {
		return err
	}
	defer job.Close()
	rank, size := job.Rank(), job.Size()
	key, err := job.AuthKey()
	if err != nil {
		return err
	}
	if rank == 0 {
		if err := job.Put("go.key", key[:]); err != nil {
			return err
		}
	}
	ctx, err := courier.NewContext((&courier.ContextParams{}).EnableTag())
	if err != nil {
		return err
	}
	defer ctx.Close()
	w, err := ctx.NewWorker((&courier.WorkerParams{}).SetThreadMode(courier.ThreadModeMulti))
	if err != nil {
		return err
	}
	defer w.Close()
	const t = 60 * time.Second
	world, err := courier.NewJobWorld(job, w, t)
	if err != nil {
		return err
	}
	defer world.Close()
	k0, err := job.Get(0, "go.key", t)
	if err != nil {
		return err
	}
	if !bytes.Equal(k0, key[:]) {
		return fmt.Errorf("rank %d: the authentication key differs from rank 0's", rank)
	}
	wait := func(r *courier.Request) error {
		c, cancel := context.WithTimeout(context.Background(), t)
		defer cancel()
		return r.Wait(c)
	}

	// Ring: only the right neighbour is connected.
	right, left := (rank+1)%size, (rank+size-1)%size
	in := make([]byte, msgLen)
	rr, err := w.RecvTag(in, 1000+uint64(left), ^uint64(0), nil)
	if err != nil {
		return err
	}
	ep, err := world.Endpoint(right)
	if err != nil {
		return err
	}
	sr, err := ep.SendTag(pattern(rank, right, 0), 1000+uint64(rank), nil)
	if err != nil {
		return err
	}
	if err := wait(sr); err != nil {
		return err
	}
	if err := wait(rr); err != nil {
		return err
	}
	if !bytes.Equal(in, pattern(left, rank, 0)) {
		return fmt.Errorf("rank %d: ring data from %d differs", rank, left)
	}
	if n := world.Connected(); n != 1 {
		return fmt.Errorf("rank %d: the ring made %d endpoints, not 1", rank, n)
	}
	if err := world.Barrier(t); err != nil {
		return err
	}

	// All-to-all, eager.
	if err := world.ConnectAll(); err != nil {
		return err
	}
	ins := make([][]byte, size)
	recvs := make([]*courier.Request, size)
	for p := uint32(0); p < size; p++ {
		ins[p] = make([]byte, msgLen)
		if recvs[p], err = w.RecvTag(ins[p], 2000+uint64(p), ^uint64(0), nil); err != nil {
			return err
		}
	}
	sends := make([]*courier.Request, size)
	for p := uint32(0); p < size; p++ {
		ep, err := world.Endpoint(p)
		if err != nil {
			return err
		}
		if sends[p], err = ep.SendTag(pattern(rank, p, 0x5a), 2000+uint64(rank), nil); err != nil {
			return err
		}
	}
	for p := uint32(0); p < size; p++ {
		if err := wait(sends[p]); err != nil {
			return err
		}
		if err := wait(recvs[p]); err != nil {
			return err
		}
		if !bytes.Equal(ins[p], pattern(p, rank, 0x5a)) {
			return fmt.Errorf("rank %d: all-to-all data from %d differs", rank, p)
		}
	}
	if err := world.Barrier(t); err != nil {
		return err
	}
	fmt.Printf("jobring: rank %d of %d (local %d of %d, host %d, %s): ring and all-to-all OK\n",
		rank, size, job.LocalRank(), job.LocalSize(), job.HostID(), job.Launcher())
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "jobring:", err)
		os.Exit(1)
	}
}
