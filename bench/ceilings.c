/* What this machine allows, without any communication library: the ceilings the
 * bandwidth targets are judged against (bench/run.sh appends them to RESULTS.md).
 *
 *   tcp N     one process streams 4 GiB to another over N loopback TCP connections
 *             (1 MiB writes, poll-driven, non-blocking; sender and receiver on CPUs 1, 0)
 *   copy      16 MiB copies: memcpy in one process, process_vm_readv (CMA) from another
 *             process, and two processes each memcpy-ing half through shared memory
 *
 * Each measurement prints one JSON line: {"what": ..., "conns": N, "mbs": MB/s}.
 * Build: cc -O2 -o ceilings bench/ceilings.c */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

/* Sender: stream `total` bytes spread over the connections, 1 MiB per write. */
static void tcp_send(const struct sockaddr_in *a, int n, long total) {
	int s[MAX_CONNS], one = 1;
	long sent[MAX_CONNS] = {0}, per = total / n;
	char *buf = malloc(MIB);
	if (buf == NULL)
		_exit(1);
	memset(buf, 1, MIB);
	for (int i = 0; i < n; i++) {
		s[i] = socket(AF_INET, SOCK_STREAM, 0);
		setsockopt(s[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		if (connect(s[i], (const struct sockaddr *)a, sizeof *a) != 0)
			_exit(1);
		fcntl(s[i], F_SETFL, O_NONBLOCK);
	}
	for (;;) {
		struct pollfd p[MAX_CONNS];
		int left = 0;
		for (int i = 0; i < n; i++) {
			p[i].fd = s[i];
			p[i].events = sent[i] < per ? POLLOUT : 0;
			left += sent[i] < per;
		}
		if (left == 0)
			break;
		if (poll(p, n, -1) < 0 && errno != EINTR)
			_exit(1);
		for (int i = 0; i < n; i++) {
			if (!(p[i].revents & POLLOUT))
				continue;
			long off = sent[i] % MIB, want = MIB - off;
			if (want > per - sent[i])
				want = per - sent[i];
			ssize_t k = write(s[i], buf + off, want);
			if (k > 0)
				sent[i] += k;
		}
	}
	for (int i = 0; i < n; i++)
		close(s[i]);
	_exit(0);
}

static int tcp(int n) {
	long total = 4096 * MIB;
	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof a;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, MAX_CONNS) != 0 ||
	    getsockname(ls, (struct sockaddr *)&a, &al) != 0)
		die("listen");
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		pin(1);
		tcp_send(&a, n, total);
	}
	pin(0);
	int s[MAX_CONNS];
	for (int i = 0; i < n; i++) {
		s[i] = accept(ls, NULL, NULL);
		if (s[i] < 0)
			die("accept");
		fcntl(s[i], F_SETFL, O_NONBLOCK);
	}
	char *buf = malloc(MIB);
	if (buf == NULL)
		die("malloc");
	long got = 0;
	int open = n;
	double t0 = now();
	while (open > 0) {
		struct pollfd p[MAX_CONNS];
		for (int i = 0; i < n; i++) {
			p[i].fd = s[i];
			p[i].events = POLLIN;
		}
		if (poll(p, n, -1) < 0 && errno != EINTR)
			die("poll");
		for (int i = 0; i < n; i++) {
			if (s[i] < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			ssize_t k = read(s[i], buf, MIB);
			if (k > 0) {
				got += k;
			} else if (k == 0 || errno != EAGAIN) {
				close(s[i]);
				s[i] = -1; /* poll ignores negative fds */
				open--;
			}
		}
	}
	double dt = now() - t0;
	int st = 0;
	waitpid(child, &st, 0);
	if (got != total || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "tcp %d: received %ld of %ld bytes\n", n, got, total);
		return 1;
	}
	printf("{\"what\": \"tcp_stream\", \"conns\": %d, \"mbs\": %.0f}\n", n, got / dt / 1e6);
	return 0;
}

static char *shared(long len) {
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		die("mmap");
	memset(p, 1, len);
	return p;
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
	printf("{\"what\": \"memcpy_1proc\", \"conns\": 0, \"mbs\": %.0f}\n", reps * len / (now() - t0) / 1e6);

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
			printf("{\"what\": \"cma_read\", \"conns\": 0, \"mbs\": %.0f}\n", reps * len / (now() - t0) / 1e6);
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
	printf("{\"what\": \"memcpy_split_2proc\", \"conns\": 0, \"mbs\": %.0f}\n", reps * len / (now() - t0) / 1e6);
	return 0;
}

int main(int argc, char **argv) {
	if (argc == 3 && strcmp(argv[1], "tcp") == 0) {
		int n = atoi(argv[2]);
		if (n < 1 || n > MAX_CONNS) {
			fprintf(stderr, "ceilings tcp N: N from 1 to %d\n", MAX_CONNS);
			return 2;
		}
		return tcp(n);
	}
	if (argc == 2 && strcmp(argv[1], "copy") == 0)
		return copy();
	fprintf(stderr, "usage: ceilings tcp N | ceilings copy\n");
	return 2;
}
