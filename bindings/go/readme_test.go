package courier_test

// The Go blocks of README.md: each region between "snippet:" and "snippet-end" is copied
// into the README and compared by scripts/check-snippets.py; go vet and go test compile it.
// cmd/hello is the whole program, run as two processes by make test-hello.

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"

	"courier.dev/courier"
)

func readmeQuickstart(addr *net.TCPAddr, header, data []byte) error {
	// snippet: quickstart
	ctx, err := courier.NewContext((&courier.ContextParams{}).EnableTag().EnableAM().EnableWakeup())
	if err != nil {
		return err // a *courier.Error: errors.Is(err, courier.ErrX), and the library's reason
	}
	defer ctx.Close()
	w, _ := ctx.NewWorker((&courier.WorkerParams{}).SetThreadMode(courier.ThreadModeMulti))
	defer w.Close()
	go func() { // or Request.Wait, which progresses
		for {
			w.Progress()
		}
	}()

	// Server: keep the endpoint the listener accepts, to answer on it.
	accepted := make(chan *courier.Endpoint, 1)
	l, _ := w.NewListener((&courier.ListenerParams{Address: "0.0.0.0:13337"}).
		SetConnectionHandler(func(r *courier.ConnRequest) {
			if ep, err := r.Accept(nil); err == nil {
				accepted <- ep
			}
		}))
	defer l.Close()

	// Client: connect to a listener's address.
	ep, _ := w.NewEndpoint((&courier.EndpointParams{}).SetSocketAddress(addr).SetClientID(7).
		SetErrorHandler(func(ep *courier.Endpoint, err error) { log.Print(err) }))
	w.SetAMHandler(1, func(m *courier.AMMessage) { /* m.Header, m.Data, m.ReplyEndpoint(), m.ReceiveData */ })
	req, _ := ep.SendAM(1, header, data, courier.AMReply, func(info courier.Info, err error) {})
	err = req.Wait(context.Background()) // or <-req.Done(), then req.Err()
	if errors.Is(err, courier.ErrPeerFailure) {
		log.Print("the server went away")
	}
	// snippet-end
	return err
}

func readmeOneSided(c context.Context, ep *courier.Endpoint, w *courier.Worker, data []byte, base uint64, off int) error {
	// snippet: onesided
	ctx, _ := courier.NewContext((&courier.ContextParams{}).EnableRMA().EnableAtomics().EnableWakeup())
	mem, _ := ctx.MemMap((&courier.MemMapParams{}).SetMemoryType(courier.MemoryTypeHost).Allocate().SetLength(1 << 20))
	key, _ := mem.PackRkey() // send key and mem.Query().Address to the peer
	// peer:
	rk, _ := ep.UnpackRkey(key)
	req, _ := ep.Put(data, base, rk, nil)                         // Get, PutSignal(data, addr, rk, sigAddr, rk, 1, courier.SignalAdd, nil)
	req, _ = ep.Atomic(courier.AtomicAdd, 1, 0, base+64, rk, nil) // Atomic32 for 32-bit words
	_ = req.Wait(context.Background())
	old := req.Info().Value
	// owner:
	v, _ := mem.SignalWaitUntil(c, w, off, courier.CmpGE, 1) // nil worker: progressed elsewhere
	// snippet-end
	_, _ = old, v
	return nil
}

func readmeNetConn(ctx *courier.Context, handler http.Handler) *http.Transport {
	// snippet: netconn
	l, _ := courier.Listen(ctx, "0.0.0.0:8080") // ctx with EnableStream().EnableWakeup()
	go http.Serve(l, handler)
	tr := &http.Transport{DialContext: func(c context.Context, _, addr string) (net.Conn, error) {
		return courier.DialContext(c, ctx, addr)
	}}
	// snippet-end
	return tr
}
