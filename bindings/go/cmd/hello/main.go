// Command hello is two processes saying hello: a server that listens and keeps the
// endpoint it accepts, a client that connects to it, and a tag message and an active
// message each way.
//
//	hello server 127.0.0.1:13337     # prints "listening on 127.0.0.1:13337"
//	hello client 127.0.0.1:13337     # COURIER_TLS=tcp for tcp on one host (shm by default)
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"courier.dev/courier"
)

const (
	tagToServer = 1
	tagToClient = 2
	tagBye      = 3
	amToServer  = 1
	amToClient  = 2
)

func main() {
	if len(os.Args) != 3 || (os.Args[1] != "server" && os.Args[1] != "client") {
		fmt.Fprintln(os.Stderr, "usage: hello server IP:PORT | hello client IP:PORT")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
		// Errors say what failed and why; errors.Is(err, courier.ErrPeerFailure) and the
		// other courier.Err* values tell kinds apart.
		fmt.Fprintln(os.Stderr, "hello:", err)
		os.Exit(1)
	}
}

func run(role, addr string) error {
	ctx, err := courier.NewContext((&courier.ContextParams{}).EnableTag().EnableAM().EnableWakeup())
	if err != nil {
		return err
	}
	defer ctx.Close()
	// A multi-thread worker may be used from any goroutine; Request.Wait progresses it.
	w, err := ctx.NewWorker((&courier.WorkerParams{}).SetThreadMode(courier.ThreadModeMulti))
	if err != nil {
		return err
	}
	defer w.Close()
	// Active messages arrive in a handler that runs inside progress.
	ams := make(chan string, 1)
	id := uint16(amToClient)
	if role == "server" {
		id = amToServer
	}
	if err := w.SetAMHandler(id, func(m *courier.AMMessage) { ams <- string(m.Data) }); err != nil {
		return err
	}
	if role == "server" {
		return server(w, addr, ams)
	}
	return client(w, addr, ams)
}

func onError(ep *courier.Endpoint, err error) { fmt.Fprintln(os.Stderr, "hello: peer failed:", err) }

// wait waits for a request (nil: it completed at once), at most 30 s.
func wait(req *courier.Request, err error) error {
	if err != nil {
		return err
	}
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return req.Wait(c)
}

// recv receives one message with the tag.
func recv(w *courier.Worker, tag uint64) (string, error) {
	buf := make([]byte, 64)
	req, err := w.RecvTag(buf, tag, ^uint64(0), nil)
	if err := wait(req, err); err != nil {
		return "", err
	}
	return string(buf[:req.Info().Length]), nil
}

// nextAM progresses the worker until an active message arrived.
func nextAM(w *courier.Worker, ams chan string) (string, error) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case m := <-ams:
			return m, nil
		default:
			w.Progress()
		}
	}
	return "", errors.New("no active message within 30 s")
}

// snippet: server
func server(w *courier.Worker, addr string, ams chan string) error {
	accepted := make(chan *courier.Endpoint, 1)
	l, err := w.NewListener((&courier.ListenerParams{Address: addr}).SetConnectionHandler(
		func(r *courier.ConnRequest) {
			// Keep the accepted endpoint: the server answers on it.
			ep, err := r.Accept((&courier.EndpointParams{}).SetErrorHandler(onError))
			if err != nil {
				fmt.Fprintln(os.Stderr, "hello: accept:", err)
				return
			}
			accepted <- ep
		}))
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Println("listening on", l.Addr())
	var ep *courier.Endpoint
	for deadline := time.Now().Add(30 * time.Second); ep == nil; {
		select {
		case ep = <-accepted:
		default:
			if time.Now().After(deadline) {
				return errors.New("no client within 30 s")
			}
			w.Progress()
		}
	}
	msg, err := recv(w, tagToServer)
	if err != nil {
		return err
	}
	fmt.Println("server: tag:", msg)
	if err := wait(ep.SendTag([]byte("hello, client"), tagToClient, nil)); err != nil {
		return err
	}
	if msg, err = nextAM(w, ams); err != nil {
		return err
	}
	fmt.Println("server: am:", msg)
	if err := wait(ep.SendAM(amToClient, nil, []byte("hello, client (am)"), 0, nil)); err != nil {
		return err
	}
	if _, err := recv(w, tagBye); err != nil { // the client has everything
		return err
	}
	if err := ep.Close(); err != nil {
		return err
	}
	fmt.Println("server: done")
	return nil
}

// snippet-end

// snippet: client
func client(w *courier.Worker, addr string, ams chan string) error {
	ep, err := w.NewEndpoint((&courier.EndpointParams{SocketAddress: addr}).SetClientID(7).
		SetErrorHandler(onError))
	if err != nil {
		return err
	}
	if err := ep.WaitConnected(30 * time.Second); err != nil {
		return err
	}
	fmt.Println("client: connected over", ep.Transport())
	// Post the receive first, then send; both complete as the worker progresses.
	buf := make([]byte, 64)
	rreq, err := w.RecvTag(buf, tagToClient, ^uint64(0), nil)
	if err != nil {
		return err
	}
	if err := wait(ep.SendTag([]byte("hello, server"), tagToServer, nil)); err != nil {
		return err
	}
	if err := wait(rreq, nil); err != nil {
		return err
	}
	fmt.Println("client: tag:", string(buf[:rreq.Info().Length]))
	if err := wait(ep.SendAM(amToServer, nil, []byte("hello, server (am)"), 0, nil)); err != nil {
		return err
	}
	msg, err := nextAM(w, ams)
	if err != nil {
		return err
	}
	fmt.Println("client: am:", msg)
	if err := wait(ep.SendTag([]byte("bye"), tagBye, nil)); err != nil {
		return err
	}
	if err := ep.Close(); err != nil {
		return err
	}
	fmt.Println("client: done")
	return nil
}

// snippet-end
