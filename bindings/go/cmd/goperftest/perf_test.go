package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// runPair runs a server and a client in this process for a few iterations.
func runPair(t *testing.T, p Params) (Result, []Row) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p.Port = 0
	ready := make(chan string, 1)
	srvErr := make(chan error, 1)
	go func() { srvErr <- RunServer(ctx, &p, ready) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-srvErr:
		t.Fatalf("server: %v", err)
	}
	_, port, _ := net.SplitHostPort(addr)
	cp := p
	cp.Server = net.JoinHostPort("127.0.0.1", port)
	rows := make(chan Row, 1024)
	res, err := RunClient(ctx, &cp, rows)
	close(rows)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	if err := <-srvErr; err != nil {
		t.Fatalf("server: %v", err)
	}
	var got []Row
	for r := range rows {
		got = append(got, r)
	}
	return res, got
}

func TestPerfBandwidthAndLatency(t *testing.T) {
	base := Params{Iterations: 250, Warmup: 5, Threads: 1, Window: 8, MemType: "host", RndvThresh: 65536}
	for _, c := range []struct {
		name    string
		size    int
		threads int
		lat     bool
		wakeup  bool
	}{
		{"eager", 4096, 1, false, false},
		{"rndv-2threads", 256 << 10, 2, false, true},
		{"latency", 8, 1, true, false},
		{"latency-rndv", 128 << 10, 1, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := base
			p.Size, p.Threads, p.Latency, p.Wakeup = c.size, c.threads, c.lat, c.wakeup
			res, rows := runPair(t, p)
			if res.Iterations != p.Iterations || res.Size != c.size || res.LatencyMs <= 0 || res.BandwidthGbps <= 0 {
				t.Fatalf("result %+v", res)
			}
			// a row every 100 iterations per thread, short of the last
			if len(rows) != 2*c.threads {
				t.Fatalf("%d rows, want %d", len(rows), 2*c.threads)
			}
			var out bytes.Buffer
			printHeader(&out)
			for _, r := range rows {
				printRow(&out, r)
			}
			printSummary(&out, res)
			if !strings.Contains(out.String(), "| Thread | Iteration | Latency | Bandwidth (Gb/s) |") ||
				!strings.Contains(out.String(), "Number of iterations: 250, number of threads: ") {
				t.Fatalf("output:\n%s", out.String())
			}
		})
	}
}

func TestParamsCheck(t *testing.T) {
	p := Params{Size: 8, Iterations: 1, Threads: 1, Window: 1, MemType: "floppy"}
	if err := p.check(); err == nil || !strings.Contains(err.Error(), "host or cuda") {
		t.Fatalf("floppy: %v", err)
	}
	for _, m := range []string{"host", "cuda"} {
		p.MemType = m
		if err := p.check(); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
	}
}
