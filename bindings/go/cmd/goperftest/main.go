// Command goperftest measures active-message bandwidth (and, with -lat, latency) between
// two processes over Courier, like UCX's Go perftest.
//
//	goperftest                      # server: listen on -p (default 13338)
//	goperftest -i HOST -s 1048576   # client: send -n messages of -s bytes, print the table
//
// The client sends active messages of -s bytes (with AMRndv from -rndv-thresh bytes on)
// keeping -O of them in flight; the server receives them (rendezvous data with ReceiveData
// into a preallocated buffer) and acknowledges the last. -lat measures ping-pong latency
// instead (one-way, RTT/2). -json prints one JSON line with the summary.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
)

func main() {
	p := &Params{}
	flag.IntVar(&p.Size, "s", 4096, "message size in bytes")
	flag.IntVar(&p.Iterations, "n", 1000, "measured iterations")
	flag.IntVar(&p.Threads, "t", 1, "client threads (each with its own worker and endpoint)")
	flag.StringVar(&p.Server, "i", "", "server address to connect to (none: be the server)")
	flag.IntVar(&p.Port, "p", 13338, "server port")
	flag.StringVar(&p.MemType, "m", "host", "memory type of the message buffers (host, cuda)")
	flag.BoolVar(&p.Wakeup, "wakeup", false, "sleep on the worker's event fd when idle instead of polling")
	flag.IntVar(&p.Warmup, "warmup", 10, "warm-up iterations (not measured)")
	flag.IntVar(&p.Window, "O", 32, "outstanding sends (bandwidth test)")
	flag.BoolVar(&p.Latency, "lat", false, "ping-pong latency test (one-way latency, RTT/2)")
	flag.IntVar(&p.RndvThresh, "rndv-thresh", 65536, "send messages of at least this many bytes with the rendezvous flag (0: let the library choose)")
	jsonOut := flag.Bool("json", false, "print only a one-line JSON summary")
	flag.Parse()
	if err := p.check(); err != nil {
		fmt.Fprintln(os.Stderr, "goperftest:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if p.Server == "" {
		if err := RunServer(ctx, p, nil); err != nil {
			fmt.Fprintln(os.Stderr, "goperftest server:", err)
			os.Exit(1)
		}
		return
	}
	if _, _, err := net.SplitHostPort(p.Server); err != nil {
		p.Server = net.JoinHostPort(p.Server, strconv.Itoa(p.Port))
	}
	rows := make(chan Row, 64)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if !*jsonOut {
			printHeader(os.Stdout)
		}
		for r := range rows {
			if !*jsonOut {
				printRow(os.Stdout, r)
			}
		}
	}()
	res, err := RunClient(ctx, p, rows)
	close(rows)
	wg.Wait()
	if err != nil {
		fmt.Fprintln(os.Stderr, "goperftest:", err)
		os.Exit(1)
	}
	if *jsonOut {
		b, _ := json.Marshal(res)
		fmt.Println(string(b))
		return
	}
	printSummary(os.Stdout, res)
}
