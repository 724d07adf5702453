package courier

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Rendezvous active messages are delivered from the progress call's batch, after the
// library returned: the handler may receive the data and wait for it right there (which a
// handler running inside the library could not, as progress does not nest), keep the
// message for later, or leave it, which releases the sender. Messages keep the order they
// were sent in, eager and rendezvous alike. (The waiting handler runs alone: messages that
// arrive while it progresses the worker are delivered inside its wait.)
func TestRndvAMFromBatch(t *testing.T) {
	_, b, ep := pair(t)
	if err := ep.WaitConnected(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	const size = 300000
	var mu sync.Mutex
	var order []string
	var waited []byte
	errs := make(chan error, 16)
	kept := make(chan *AMMessage, 1)
	if err := b.SetAMHandler(1, func(m *AMMessage) {
		h := string(m.Header)
		mu.Lock()
		order = append(order, h)
		mu.Unlock()
		if h == "eager" {
			if m.IsRndv() || string(m.Data) != "small" {
				errs <- fmt.Errorf("eager message: rndv %v, data %q", m.IsRndv(), m.Data)
			}
			return
		}
		if !m.IsRndv() || m.DataLen != size || m.Data != nil {
			errs <- fmt.Errorf("%s: rndv %v, length %d", h, m.IsRndv(), m.DataLen)
			return
		}
		switch h {
		case "wait":
			buf := make([]byte, m.DataLen)
			if err := receiveAndWait(m, buf); err != nil {
				errs <- fmt.Errorf("receive and wait in the handler: %w", err)
				return
			}
			mu.Lock()
			waited = buf
			mu.Unlock()
		case "keep":
			m.Keep()
			kept <- m
		case "leave":
			// Neither received nor kept: released when the handler returns.
		}
	}); err != nil {
		t.Fatal(err)
	}

	send := func(header string, data []byte, flags AMFlags) *Request {
		t.Helper()
		r, err := ep.SendAM(1, []byte(header), data, flags, nil)
		if err != nil {
			t.Fatalf("SendAM %s: %v", header, err)
		}
		return r
	}
	first, second, third := pattern(size, 1), pattern(size, 2), pattern(size, 3)
	wait(t, send("wait", first, AMRndv))
	rLeave1, rEager := send("leave", third, AMRndv), send("eager", []byte("small"), 0)
	rKeep, rLeave := send("keep", second, AMRndv), send("leave", third, AMRndv)
	maybeGC()
	wait(t, rLeave1) // released: the sender's request completes
	wait(t, rEager)
	wait(t, rLeave)

	var m *AMMessage
	select {
	case m = <-kept:
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(testTimeout):
		t.Fatal("kept message did not arrive")
	}
	buf := make([]byte, m.DataLen)
	r, err := m.ReceiveData(buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	maybeGC()
	if info := wait(t, r); info.Length != size || !bytes.Equal(buf, second) {
		t.Fatalf("kept message: %d bytes, contents equal %v", info.Length, bytes.Equal(buf, second))
	}
	wait(t, rKeep)
	if _, err := m.ReceiveData(buf, nil); err == nil {
		t.Fatal("a second ReceiveData of one message succeeded")
	}
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	mu.Lock()
	defer mu.Unlock()
	if !bytes.Equal(waited, first) {
		t.Fatal("data received and waited for in the handler differs")
	}
	if fmt.Sprint(order) != "[wait leave eager keep leave]" {
		t.Fatalf("handlers ran in the order %v", order)
	}
}

// A rendezvous message that allows a reply still reaches its handler inside the library
// (the reply endpoint is lent for the call): the handler replies and receives the data.
func TestRndvAMWithReply(t *testing.T) {
	a, b, ep := pair(t)
	if err := ep.WaitConnected(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	data := pattern(200000, 9)
	got := make(chan []byte, 1)
	errs := make(chan error, 2)
	if err := b.SetAMHandler(1, func(m *AMMessage) {
		rep := m.ReplyEndpoint()
		if rep == nil || !m.IsRndv() {
			errs <- fmt.Errorf("reply endpoint %v, rndv %v", rep, m.IsRndv())
			return
		}
		buf := make([]byte, m.DataLen)
		if _, err := m.ReceiveData(buf, func(_ Info, err error) {
			if err != nil {
				errs <- err
				return
			}
			got <- buf
		}); err != nil {
			errs <- err
			return
		}
		if _, err := rep.SendAM(2, []byte("ok"), nil, 0, nil); err != nil {
			errs <- err
		}
	}); err != nil {
		t.Fatal(err)
	}
	replied := make(chan struct{})
	if err := a.SetAMHandler(2, func(*AMMessage) { close(replied) }); err != nil {
		t.Fatal(err)
	}
	r, err := ep.SendAM(1, []byte("h"), data, AMRndv|AMReply, nil)
	if err != nil {
		t.Fatal(err)
	}
	maybeGC()
	wait(t, r)
	for done := 0; done < 2; {
		select {
		case buf := <-got:
			if !bytes.Equal(buf, data) {
				t.Fatal("rendezvous data differs")
			}
			done++
		case <-replied:
			replied = nil
			done++
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(testTimeout):
			t.Fatal("no reply or data")
		}
	}
}

// A kept rendezvous message whose worker was closed: Release and ReceiveData report the
// closed worker instead of handing the library a destroyed one (a crash, or a nonsense
// error, before they checked).
func TestKeptAMAfterWorkerClose(t *testing.T) {
	a, b, _, stopB := progressedPair(t)
	ep := dial(t, a, b)
	t.Cleanup(func() { ep.CloseForce() })
	kept := make(chan *AMMessage, 1)
	if err := b.SetAMHandler(3, func(m *AMMessage) {
		if m.IsRndv() {
			m.Keep()
			kept <- m
		}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := ep.SendAM(3, []byte("h"), pattern(1<<20, 2), AMRndv, nil); err != nil {
		t.Fatal(err)
	}
	var m *AMMessage
	select {
	case m = <-kept:
	case <-time.After(testTimeout):
		t.Fatal("the rendezvous message did not arrive")
	}
	stopB()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := m.Release(); err == nil || err.Error() != errClosed("worker").Error() {
			t.Fatalf("Release after the worker closed: %v", err)
		}
	}
	if _, err := m.ReceiveData(make([]byte, m.DataLen), nil); err == nil || err.Error() != errClosed("worker").Error() {
		t.Fatalf("ReceiveData after the worker closed: %v", err)
	}
}

// A rendezvous message with an empty header is batched like the others, so its handler
// may wait for its data. (An empty reservation in the batch's arena once read as out of
// memory: the message went to a direct call inside the library, where the wait cannot
// progress and stalled.)
func TestRndvAMEmptyHeaderFromBatch(t *testing.T) {
	_, b, ep := pair(t)
	if err := ep.WaitConnected(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	const size = 200000
	data := pattern(size, 4)
	errs := make(chan error, 1)
	if err := b.SetAMHandler(1, func(m *AMMessage) {
		if !m.IsRndv() || len(m.Header) != 0 {
			errs <- fmt.Errorf("rndv %v, header %q", m.IsRndv(), m.Header)
			return
		}
		buf := make([]byte, m.DataLen)
		err := receiveAndWait(m, buf)
		if err == nil && !bytes.Equal(buf, data) {
			err = fmt.Errorf("data differs")
		}
		errs <- err
	}); err != nil {
		t.Fatal(err)
	}
	r, err := ep.SendAM(1, nil, data, AMRndv, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if err != nil {
			t.Fatalf("receive and wait in the handler: %v", err)
		}
	case <-time.After(2 * testTimeout):
		t.Fatal("handler did not finish")
	}
	wait(t, r)
}

// receiveAndWait receives a rendezvous message's data into buf and waits for it, at most
// testTimeout (inside the handler, whose worker progresses the receive).
func receiveAndWait(m *AMMessage, buf []byte) error {
	r, err := m.ReceiveData(buf, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	return r.Wait(ctx)
}
