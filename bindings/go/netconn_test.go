package courier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func streamContext(t *testing.T, tls string) *Context {
	t.Helper()
	p := (&ContextParams{}).EnableStream().EnableWakeup().SetName(t.Name())
	if tls != "" {
		p.SetConfig("COURIER_TLS", tls)
	}
	c, err := NewContext(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func forTransports(t *testing.T, f func(t *testing.T, tls string)) {
	for _, tls := range []string{"", "tcp"} {
		name := tls
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) { f(t, tls) })
	}
}

// A listener on a free loopback port, and the connection it accepts first (nil, with the
// error reported, if accepting fails).
func listenAndAcceptOne(t *testing.T, c *Context) (net.Listener, <-chan net.Conn) {
	t.Helper()
	l, err := Listen(c, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		s, err := l.Accept()
		if err != nil {
			t.Error(err)
			close(accepted)
			return
		}
		accepted <- s
	}()
	return l, accepted
}

func TestNetConn(t *testing.T) {
	forTransports(t, func(t *testing.T, tls string) {
		c := streamContext(t, tls)
		l, accepted := listenAndAcceptOne(t, c)
		defer l.Close()
		cl, err := Dial(c, l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if _, err := cl.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		s := <-accepted
		if s == nil {
			t.FailNow()
		}
		if s.LocalAddr().String() != l.Addr().String() || s.RemoteAddr().Network() != "courier" ||
			cl.RemoteAddr().String() != l.Addr().String() {
			t.Fatalf("addresses: %v %v %v", s.LocalAddr(), s.RemoteAddr(), cl.RemoteAddr())
		}
		// The dialled side reports its own socket: same host, another port.
		la, ok := cl.LocalAddr().(*net.TCPAddr)
		lhost, lport, _ := net.SplitHostPort(l.Addr().String())
		if !ok || la.IP.String() != lhost || strconv.Itoa(la.Port) == lport || la.Port == 0 {
			t.Fatalf("dialled local address %v (listener %v)", cl.LocalAddr(), l.Addr())
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("read %q, %v", buf, err)
		}
		// A read deadline ends a read with nothing to read; the next read still works.
		s.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
		start := time.Now()
		_, err = s.Read(buf)
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("read past the deadline: %v", err)
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("deadline honoured late")
		}
		// A deadline moved into the past wakes a blocked read.
		s.SetReadDeadline(time.Time{})
		woke := make(chan error, 1)
		go func() { _, err := s.Read(buf); woke <- err }()
		time.Sleep(20 * time.Millisecond)
		s.SetReadDeadline(time.Unix(1, 0))
		if err := <-woke; !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read woken by a past deadline: %v", err)
		}
		s.SetReadDeadline(time.Time{})
		big := pattern(3<<20+5, 9)
		wrote := make(chan error, 1)
		go func() { _, err := cl.Write(big); wrote <- err }()
		got := make([]byte, len(big))
		if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, big) {
			t.Fatalf("big read: %v", err)
		}
		// The writer finishes before the connection (and, at the end, its worker) closes.
		if err := <-wrote; err != nil {
			t.Fatalf("big write: %v", err)
		}
		// Close on one side is EOF on the other.
		cl.Close()
		if n, err := s.Read(buf); err != io.EOF {
			t.Fatalf("read after the peer closed: %d, %v", n, err)
		}
		s.Close()
		if _, err := s.Read(buf); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read after close: %v", err)
		}
	})
}

func TestHTTPOverCourier(t *testing.T) {
	forTransports(t, func(t *testing.T, tls string) {
		c := streamContext(t, tls)
		l, err := Listen(c, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		big := pattern(1<<20, 3)
		mux := http.NewServeMux()
		mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello %s", r.URL.Query().Get("name"))
		})
		mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Write(big)
		})
		mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
			b, err := io.ReadAll(r.Body) // HTTP/1 handlers are not full duplex: read, then write
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.Write(b)
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(l) }()

		tr := &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return DialContext(ctx, c, addr)
			},
			MaxIdleConnsPerHost: 4,
		}
		client := &http.Client{Transport: tr, Timeout: testTimeout}
		base := "http://" + l.Addr().String()
		get := func(path string) []byte {
			resp, err := client.Get(base + path)
			if err != nil {
				t.Errorf("GET %s: %v", path, err)
				return nil
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != 200 {
				t.Errorf("GET %s: %d, %v", path, resp.StatusCode, err)
			}
			return b
		}
		if b := get("/hello?name=courier"); string(b) != "hello courier" {
			t.Fatalf("hello: %q", b)
		}
		if b := get("/big"); !bytes.Equal(b, big) {
			t.Fatalf("big: %d bytes", len(b))
		}
		// several at once, over several connections
		var wg sync.WaitGroup
		for i := 0; i < 6; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				if i%2 == 0 {
					if b := get("/big"); !bytes.Equal(b, big) {
						t.Errorf("big %d: %d bytes", i, len(b))
					}
					return
				}
				body := strings.Repeat(fmt.Sprint(i), 100000)
				resp, err := client.Post(base+"/echo", "text/plain", strings.NewReader(body))
				if err != nil {
					t.Errorf("POST: %v", err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(b) != body {
					t.Errorf("echo %d: %d bytes", i, len(b))
				}
			}(i)
		}
		wg.Wait()
		tr.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Fatalf("shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Fatalf("serve: %v", err)
		}
	})
}

// DialContext with a context already past its deadline, or canceled, returns the
// context's error promptly (a deadline already past reached the library as a negative
// timeout, read as a day; a cancellation was not looked at). So does WaitConnected with a
// negative timeout.
func TestDialContextEnds(t *testing.T) {
	// A TCP server that accepts and never speaks: the setup never completes.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			s, err := ln.Accept()
			if err != nil {
				return
			}
			held.Lock()
			conns = append(conns, s)
			held.Unlock()
		}
	}()
	defer func() {
		held.Lock()
		for _, s := range conns {
			s.Close()
		}
		held.Unlock()
	}()
	c := streamContext(t, "")
	dial := func(ctx context.Context) error {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			cn, err := DialContext(ctx, c, ln.Addr().String())
			if cn != nil {
				cn.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			return err
		case <-time.After(2 * testTimeout):
			t.Fatal("DialContext did not return")
			return nil
		}
	}
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if err := dial(expired); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("DialContext with an expired context: %v", err)
	}
	canceled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := dial(canceled); !errors.Is(err, context.Canceled) {
		t.Fatalf("DialContext with a canceled context: %v", err)
	}
	// Canceled while it waits (no deadline: it would wait 30 s otherwise).
	waiting, cancel3 := context.WithCancel(context.Background())
	go cancel3()
	if err := dial(waiting); !errors.Is(err, context.Canceled) {
		t.Fatalf("DialContext canceled while waiting: %v", err)
	}

	w, err := c.NewWorker((&WorkerParams{}).SetThreadMode(ThreadModeMulti))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ep, err := w.NewEndpoint((&EndpointParams{}).SetSocketAddress(ln.Addr().(*net.TCPAddr)))
	if err != nil {
		t.Fatal(err)
	}
	defer ep.CloseForce()
	done := make(chan error, 1)
	go func() { done <- ep.WaitConnected(-time.Second) }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("WaitConnected with a negative timeout: %v", err)
		}
	case <-time.After(2 * testTimeout):
		t.Fatal("WaitConnected with a negative timeout did not return")
	}
}

// A Write after the peer closed fails as a write to a closed TCP peer does (a broken
// pipe in a *net.OpError), not with io.EOF, which writers do not expect.
func TestConnWriteAfterPeerClosed(t *testing.T) {
	forTransports(t, func(t *testing.T, tls string) {
		c := streamContext(t, tls)
		l, accepted := listenAndAcceptOne(t, c)
		defer l.Close()
		cl, err := Dial(c, l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s := <-accepted
		if s == nil {
			t.Fatal("accept failed")
		}
		defer s.Close()
		cl.Close()
		buf := make([]byte, 4)
		if n, err := s.Read(buf); err != io.EOF {
			t.Fatalf("read after the peer closed: %d, %v", n, err)
		}
		// The peer's close has arrived (the read saw it): the write fails.
		_, err = s.Write([]byte("x"))
		var oe *net.OpError
		if err == nil || err == io.EOF || !errors.As(err, &oe) || oe.Op != "write" || !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("write after the peer closed: %v", err)
		}
	})
}
