/* What this machine allows, without any communication library: the ceilings the
 * bandwidth targets are judged against (bench/run.sh appends them to RESULTS.md).
 *
 *   tcp N [CC] one process streams 4 GiB to another over N loopback TCP connections
 *             (up to 1 MiB per call, both sides busy polling non-blocking sockets; sender
 *             and receiver on CPUs 1, 0), with congestion control CC on every socket
 *             ("system", the default, leaves the kernel's choice)
 *   pingpong  8-byte round trips over one loopback TCP connection, both sides busy polling
 *   cacheline [N]  8-byte round trips through two cache lines of shared memory (N of them:
 *             2M by default; bench/run.sh probes the machine's speed with 20k)
 *   copy      16 MiB copies: memcpy in one process, process_vm_readv (CMA) from another
 *             process, and two processes each memcpy-ing half through shared memory
 *   sleepy [SECS]  8-byte round trips, one every 10 ms, both sides blocking (unpinned)
 *   crowded [N]  a flat barrier of 4 processes bound round robin to CPUs 0 and 1, N times
 *             (200k), with two ways of waiting: yield at every look, or yield for the
 *             process on one's own CPU and spin up to 10 us for those on the other
 *
 * Each measurement prints one JSON line: {"what": ..., "conns": N, "mbs": MB/s} (MB = 2^20
 * bytes, as in ucx_perftest's tables; tcp_stream also names its "cc"), or for the
 * ping-pongs {"what": "tcp_pingpong" or "shm_pingpong", "rtt_us": ..., "oneway_us": ...}
 * (the TCP one's medians, the shared-memory one's mean).
 * Build: cc -O2 -o ceilings bench/ceilings.c */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1L << 20)
#define MAX_CONNS 8

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
	cpu_set_t m;
	CPU_ZERO(&m);
	CPU_SET(cpu, &m);
	(void)sched_setaffinity(0, sizeof m, &m); /* best effort: one CPU machines still run */
}

static void die(const char *what) {
	perror(what);
	exit(1);
}

/* Congestion control for a socket: "system" leaves the kernel's default. */
static int set_cc(int s, const char *cc) {
	if (strcmp(cc, "system") == 0)
		return 0;
	return setsockopt(s, IPPROTO_TCP, TCP_CONGESTION, cc, strlen(cc));
}

static int listen_lo(struct sockaddr_in *a) {
	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	socklen_t al = sizeof *a;
	*a = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(ls, (struct sockaddr *)a, sizeof *a) != 0 || listen(ls, MAX_CONNS) != 0 ||
	    getsockname(ls, (struct sockaddr *)a, &al) != 0)
		die("listen");
	return ls;
}

/* Listen on loopback (`*a`, `*ls`) and fork: the child's pid, or 0 in the child. */
static pid_t fork_lo(struct sockaddr_in *a, int *ls) {
	*ls = listen_lo(a);
	pid_t child = fork();
	if (child < 0)
		die("fork");
	return child;
}

static int dial_lo(const struct sockaddr_in *a, const char *cc) {
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	if (set_cc(s, cc) != 0 || connect(s, (const struct sockaddr *)a, sizeof *a) != 0)
		_exit(1);
	fcntl(s, F_SETFL, O_NONBLOCK);
	return s;
}

static int accept_lo(int ls, const char *cc) {
	int s = accept(ls, NULL, NULL), one = 1;
	if (s < 0)
		die("accept");
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	if (set_cc(s, cc) != 0)
		die("TCP_CONGESTION");
	fcntl(s, F_SETFL, O_NONBLOCK);
	return s;
}

/* Sender: stream `total` bytes spread over the connections, at most 1 MiB per call, trying
 * each connection in turn without waiting (busy polling, as the libraries do). */
static void tcp_send(const struct sockaddr_in *a, int n, long total, const char *cc) {
	int s[MAX_CONNS];
	long sent[MAX_CONNS] = {0}, per = total / n;
	char *buf = malloc(MIB);
	if (buf == NULL)
		_exit(1);
	memset(buf, 1, MIB);
	for (int i = 0; i < n; i++)
		s[i] = dial_lo(a, cc);
	for (int left = n; left > 0;) {
		left = 0;
		for (int i = 0; i < n; i++) {
			if (sent[i] >= per)
				continue;
			left++;
			long off = sent[i] % MIB, want = MIB - off;
			if (want > per - sent[i])
				want = per - sent[i];
			ssize_t k = send(s[i], buf + off, want, MSG_DONTWAIT | MSG_NOSIGNAL);
			if (k > 0)
				sent[i] += k;
			else if (k < 0 && errno != EAGAIN && errno != EINTR)
				_exit(1);
		}
	}
	for (int i = 0; i < n; i++)
		close(s[i]);
	_exit(0);
}

/* tcp N CC: 4 GiB over N loopback connections, receiver on CPU 0, sender on CPU 1. */
static int tcp(int n, const char *cc) {
	long total = 4096 * MIB;
	struct sockaddr_in a;
	int ls;
	pid_t child = fork_lo(&a, &ls);
	if (child == 0) {
		pin(1);
		tcp_send(&a, n, total, cc);
	}
	pin(0);
	int s[MAX_CONNS];
	for (int i = 0; i < n; i++)
		s[i] = accept_lo(ls, cc);
	char *buf = malloc(MIB);
	if (buf == NULL)
		die("malloc");
	long got = 0, at[MAX_CONNS] = {0};
	int open = n;
	double t0 = now();
	while (open > 0) {
		for (int i = 0; i < n; i++) {
			if (s[i] < 0)
				continue;
			/* Each connection fills the 1 MiB buffer from where its stream is, as a
			 * receiver of 1 MiB messages does (reading every time to the buffer's start
			 * runs at about 80% of this here). */
			long off = at[i] % MIB;
			ssize_t k = recv(s[i], buf + off, MIB - off, MSG_DONTWAIT);
			if (k > 0) {
				got += k;
				at[i] += k;
			} else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
				close(s[i]);
				s[i] = -1;
				open--;
			}
		}
	}
	double dt = now() - t0;
	int st = 0;
	waitpid(child, &st, 0);
	if (got != total || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "tcp %d %s: received %ld of %ld bytes\n", n, cc, got, total);
		return 1;
	}
	printf("{\"what\": \"tcp_stream\", \"conns\": %d, \"cc\": \"%s\", \"mbs\": %.0f}\n", n, cc,
	       got / dt / MIB);
	return 0;
}

/* Read exactly `len` bytes, busy polling. */
/* Receive `len` bytes, `flags` to recv (blocking, or MSG_DONTWAIT to busy poll; a socket
 * made non-blocking is polled either way): 0, or -1 at the connection's end. */
static int recv_n(int s, char *b, long len, int flags) {
	for (long got = 0; got < len;) {
		ssize_t k = recv(s, b + got, len - got, flags);
		if (k > 0)
			got += k;
		else if (k == 0 || (errno != EAGAIN && errno != EINTR))
			return -1;
	}
	return 0;
}

static int recv_all(int s, char *b, long len) {
	return recv_n(s, b, len, MSG_DONTWAIT);
}

static int cmp_double(const void *x, const void *y) {
	double a = *(const double *)x, b = *(const double *)y;
	return (a > b) - (a < b);
}

/* pingpong: 8-byte round trips over one loopback connection, both sides busy polling
 * non-blocking sockets (echo on CPU 0, the timed side on CPU 1): the floor under any
 * library's TCP round trip (tag_lat, ucp_fadd). */
static int pingpong(void) {
	enum { WARMUP = 10000, ITERS = 100000, LEN = 8 };
	struct sockaddr_in a;
	int ls;
	pid_t child = fork_lo(&a, &ls);
	if (child == 0) {
		pin(0);
		int s = accept_lo(ls, "system");
		char b[LEN];
		while (recv_all(s, b, LEN) == 0)
			if (send(s, b, LEN, MSG_NOSIGNAL) != LEN)
				_exit(1);
		_exit(0);
	}
	pin(1);
	int s = dial_lo(&a, "system");
	char b[LEN] = {1};
	double *rtt = malloc(ITERS * sizeof *rtt);
	if (rtt == NULL)
		die("malloc");
	for (int i = 0; i < WARMUP + ITERS; i++) {
		double t0 = now();
		if (send(s, b, LEN, MSG_NOSIGNAL) != LEN || recv_all(s, b, LEN) != 0)
			die("pingpong");
		if (i >= WARMUP)
			rtt[i - WARMUP] = now() - t0;
	}
	close(s);
	waitpid(child, NULL, 0);
	qsort(rtt, ITERS, sizeof *rtt, cmp_double);
	double med = rtt[ITERS / 2] * 1e6;
	printf("{\"what\": \"tcp_pingpong\", \"conns\": 1, \"rtt_us\": %.3f, \"oneway_us\": %.3f}\n", med,
	       med / 2);
	return 0;
}

/* sleepy [SECS]: one 8-byte round trip every 10 ms for SECS seconds (10) over one loopback
 * connection, both sides blocking in recv and neither pinned: what waking two sleeping
 * processes costs, the floor under the round trips of a client that sleeps between its
 * requests against a server that sleeps while idle (bench/hostile.sh's idle-connections
 * row times that). Prints the median, the 99th percentile and the share over 1 ms. */
static int sleepy(int secs, int poll_client) {
	enum { LEN = 8, GAP_US = 10000 };
	int n = (int)((long)secs * 1000000 / GAP_US);
	struct sockaddr_in a;
	int ls;
	pid_t child = fork_lo(&a, &ls);
	if (child == 0) {
		int s = accept_lo(ls, "system");
		char b[LEN];
		fcntl(s, F_SETFL, 0);
		while (recv_n(s, b, LEN, 0) == 0)
			if (send(s, b, LEN, MSG_NOSIGNAL) != LEN)
				_exit(1);
		_exit(0);
	}
	int s = dial_lo(&a, "system");
	if (!poll_client)
		fcntl(s, F_SETFL, 0);
	char b[LEN] = {1};
	double *rtt = malloc(n * sizeof *rtt);
	if (rtt == NULL)
		die("malloc");
	int over = 0;
	for (int i = 0; i < n; i++) {
		double t0 = now();
		if (send(s, b, LEN, MSG_NOSIGNAL) != LEN || recv_n(s, b, LEN, 0) != 0)
			die("sleepy");
		rtt[i] = now() - t0;
		over += rtt[i] > 1e-3;
		usleep(GAP_US);
	}
	close(s);
	waitpid(child, NULL, 0);
	qsort(rtt, n, sizeof *rtt, cmp_double);
	printf("{\"what\": \"%s\", \"trips\": %d, \"rtt_us\": %.1f, \"rtt_p99_us\": %.1f, "
	       "\"over_1ms_pct\": %.2f}\n",
	       poll_client ? "tcp_sleepy_poll" : "tcp_sleepy", n, rtt[n / 2] * 1e6,
	       rtt[(long)n * 99 / 100] * 1e6, over * 100.0 / n);
	return 0;
}

static char *shared(long len) {
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		die("mmap");
	memset(p, 1, len);
	return p;
}

/* cacheline: 8-byte round trips through two cache lines of one shared page, no library:
 * each side stores the iteration number in its own line and spins on the other's (ping on
 * CPU 1, echo on CPU 0); the mean over 2M round trips. The floor under any library's shared-memory
 * round trip (tag_lat, ucp_am_lat, ucp_put_lat). With a count (`cacheline 20000`), that many
 * round trips after a tenth as many unmeasured: bench/run.sh's probe of the machine's speed
 * before and after each run. Without a count it runs twice: with bare loads
 * ("shm_pingpong"), then with a gap between two looks of 16 dependent additions to a word
 * on the stack ("shm_pingpong_gap"), as Courier's `poll_gap` spaces its looks at a word a
 * peer writes. */
/* Between two looks of the spaced run: 16 additions to a word on the stack, each reading
 * back the store before it. Only that run calls it: the bare run's loop has no store. */
static void gap(void) {
	volatile uint32_t g = 0;
	for (uint32_t k = 0; k < 16; k++)
		g += k;
}

static double cacheline_run(uint64_t ITERS, int spaced) {
	const uint64_t WARMUP = ITERS / 10 < 100000 ? ITERS / 10 : 100000;
	volatile uint64_t *line = (volatile uint64_t *)shared(4096);
	volatile uint64_t *ping = &line[0], *pong = &line[8]; /* 64 bytes apart */
	*ping = 0;
	*pong = 0;
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		pin(0);
		for (uint64_t i = 1; i <= WARMUP + ITERS; i++) {
			if (spaced)
				while (__atomic_load_n(ping, __ATOMIC_ACQUIRE) != i)
					gap();
			else
				while (__atomic_load_n(ping, __ATOMIC_ACQUIRE) != i)
					;
			__atomic_store_n(pong, i, __ATOMIC_RELEASE);
		}
		_exit(0);
	}
	pin(1);
	double t0 = 0;
	for (uint64_t i = 1; i <= WARMUP + ITERS; i++) {
		if (i == WARMUP + 1)
			t0 = now(); /* the clock is read twice in all: it adds nothing per round trip */
		__atomic_store_n(ping, i, __ATOMIC_RELEASE);
		if (spaced)
			while (__atomic_load_n(pong, __ATOMIC_ACQUIRE) != i)
				gap();
		else
			while (__atomic_load_n(pong, __ATOMIC_ACQUIRE) != i)
				;
	}
	double rtt = (now() - t0) / ITERS * 1e6;
	waitpid(child, NULL, 0);
	munmap((void *)line, 4096);
	return rtt;
}

static int cacheline(uint64_t ITERS, int both) {
	for (int spaced = 0; spaced <= both; spaced++) {
		double rtt = cacheline_run(ITERS, spaced);
		printf("{\"what\": \"%s\", \"conns\": 0, \"rtt_us\": %.4f, \"oneway_us\": %.4f}\n",
		       spaced ? "shm_pingpong_gap" : "shm_pingpong", rtt, rtt / 2);
		fflush(stdout);
	}
	return 0;
}

static int copy(void) {
	const long len = 16 * MIB;
	const int reps = 60;
	char *src = shared(len), *dst = shared(len), *priv = malloc(len);
	if (priv == NULL)
		die("malloc");
	memset(priv, 2, len);
	pin(0);
	double t0 = now();
	for (int i = 0; i < reps; i++)
		memcpy(priv, src, len);
	printf("{\"what\": \"memcpy_1proc\", \"conns\": 0, \"mbs\": %.0f}\n", reps * len / (now() - t0) / MIB);

	/* CMA: read another process's (shared, so it exists in the child too) buffer. */
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		pin(1);
		for (;;)
			pause();
	}
	struct iovec l = {priv, len}, r = {src, len};
	t0 = now();
	for (int i = 0; i < reps; i++) {
		if (process_vm_readv(child, &l, 1, &r, 1, 0) != len) {
			printf("{\"what\": \"cma_read\", \"conns\": 0, \"mbs\": null}\n");
			break;
		}
		if (i == reps - 1)
			printf("{\"what\": \"cma_read\", \"conns\": 0, \"mbs\": %.0f}\n", reps * len / (now() - t0) / MIB);
	}
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);

	/* Two processes, each copying its half through shared memory at the same time. */
	t0 = now();
	child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		pin(1);
		for (int i = 0; i < reps; i++)
			memcpy(dst + len / 2, src + len / 2, len / 2);
		_exit(0);
	}
	for (int i = 0; i < reps; i++)
		memcpy(dst, src, len / 2);
	waitpid(child, NULL, 0);
	printf("{\"what\": \"memcpy_split_2proc\", \"conns\": 0, \"mbs\": %.0f}\n", reps * len / (now() - t0) / MIB);
	return 0;
}

/* crowded: the floor under a barrier of more processes than CPUs (issue 33's 4-PE rows),
 * with no library. Each process adds one to its counter at every other (a locked add into
 * the other's cache line, as a put-with-signal between same-host PEs is), then waits for
 * every other's. "yield" gives the CPU away at every look that finds a count missing;
 * "split" first waits so for the process bound to its own CPU, then spins up to 10 us
 * for those bound to the other, which run meanwhile. Prints the slowest process's mean
 * time per barrier and the context switches per barrier (all four processes). */
#define CROWD 4
static void crowded_wait(uint64_t *count, uint64_t want, int yield) {
	double t0 = 0;
	while (__atomic_load_n(count, __ATOMIC_ACQUIRE) < want) {
		if (yield) {
			sched_yield();
			continue;
		}
		if (t0 == 0)
			t0 = now();
		if (now() - t0 > 10e-6)
			sched_yield();
	}
}

static int crowded(uint64_t iters) {
	for (int split = 0; split <= 1; split++) {
		/* counts[p * 8 + q]: what q has added at p, the 8 words of p's line. */
		uint64_t *counts = (uint64_t *)shared(4096);
		double *us = (double *)(counts + 8 * CROWD);
		long *switches = (long *)(us + CROWD);
		memset(counts, 0, 4096);
		for (int me = 0; me < CROWD; me++) {
			pid_t child = fork();
			if (child < 0)
				die("fork");
			if (child)
				continue;
			pin(me % 2);
			struct rusage r0, r1;
			double t0 = 0;
			for (uint64_t k = 1; k <= iters + iters / 10; k++) {
				if (k == iters / 10 + 1) {
					getrusage(RUSAGE_SELF, &r0);
					t0 = now();
				}
				for (int j = 1; j < CROWD; j++)
					__atomic_fetch_add(&counts[((me + j) % CROWD) * 8 + me], 1, __ATOMIC_SEQ_CST);
				for (int pass = 0; pass < 2; pass++)
					for (int j = 1; j < CROWD; j++) {
						int q = (me + j) % CROWD, mate = q % 2 == me % 2;
						if (!split || mate == (pass == 0))
							crowded_wait(&counts[me * 8 + q], k, !split || mate);
					}
			}
			us[me] = (now() - t0) / iters * 1e6;
			getrusage(RUSAGE_SELF, &r1);
			switches[me] = r1.ru_nvcsw + r1.ru_nivcsw - r0.ru_nvcsw - r0.ru_nivcsw;
			_exit(0);
		}
		double worst = 0;
		long sw = 0;
		for (int i = 0; i < CROWD; i++)
			wait(NULL);
		for (int i = 0; i < CROWD; i++) {
			worst = us[i] > worst ? us[i] : worst;
			sw += switches[i];
		}
		printf("{\"what\": \"crowded_barrier_%s\", \"conns\": 0, \"us\": %.3f, "
		       "\"switches\": %.2f}\n",
		       split ? "split" : "yield", worst, (double)sw / iters);
		fflush(stdout);
		munmap(counts, 4096);
	}
	return 0;
}

int main(int argc, char **argv) {
	if ((argc == 3 || argc == 4) && strcmp(argv[1], "tcp") == 0) {
		int n = atoi(argv[2]);
		if (n < 1 || n > MAX_CONNS) {
			fprintf(stderr, "ceilings tcp N [CC]: N from 1 to %d\n", MAX_CONNS);
			return 2;
		}
		return tcp(n, argc == 4 ? argv[3] : "system");
	}
	if (argc == 2 && strcmp(argv[1], "pingpong") == 0)
		return pingpong();
	if ((argc == 2 || argc == 3) && strcmp(argv[1], "cacheline") == 0) {
		long long n = argc == 3 ? atoll(argv[2]) : 2000000;
		if (n < 1000 || n > 100000000) {
			fprintf(stderr, "ceilings cacheline [N]: N from 1000 to 100000000\n");
			return 2;
		}
		return cacheline((uint64_t)n, argc == 2);
	}
	if (argc == 2 && strcmp(argv[1], "copy") == 0)
		return copy();
	if ((argc == 2 || argc == 3 || argc == 4) && strcmp(argv[1], "sleepy") == 0) {
		int secs = argc >= 3 ? atoi(argv[2]) : 10;
		int poll_client = argc == 4 && strcmp(argv[3], "poll") == 0;
		if (secs < 1 || secs > 3600) {
			fprintf(stderr, "ceilings sleepy [SECS]: SECS from 1 to 3600\n");
			return 2;
		}
		return sleepy(secs, poll_client);
	}
	if ((argc == 2 || argc == 3) && strcmp(argv[1], "crowded") == 0) {
		long long n = argc == 3 ? atoll(argv[2]) : 200000;
		if (n < 1000 || n > 100000000) {
			fprintf(stderr, "ceilings crowded [N]: N from 1000 to 100000000\n");
			return 2;
		}
		return crowded((uint64_t)n);
	}
	fprintf(stderr, "usage: ceilings tcp N [CC] | ceilings pingpong | ceilings cacheline [N] | "
			"ceilings copy | ceilings sleepy [SECS] | ceilings crowded [N]\n");
	return 2;
}
