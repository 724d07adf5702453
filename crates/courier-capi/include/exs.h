/*
 * Extended Sockets (EXS) on Courier.
 *
 * The Open Group's Extended Sockets API (ES-API), in the shape UNH-EXS gave it: ordinary
 * socket calls plus memory registration and asynchronous event queues. Every extended call
 * only starts an operation; its completion is an event on the event queue named in the
 * call, carrying the caller's ahandle. Over Courier an EXS socket runs on shared memory
 * between processes of one host and on tcp between hosts (Courier picks; COURIER_TLS
 * restricts it). The same calls accept an ordinary kernel socket from socket(2) and carry
 * it through the kernel asynchronously (epoll), with the same events: one program runs
 * over both.
 *
 * Written by hand (not generated). Link: -lcourier (libcourier.so or libcourier.a, as for
 * courier.h). The library is thread safe; its state is not inherited across fork().
 *
 * What is the ES-API's and what is Courier's own: the ES-API and UNH-EXS fix the names and
 * roles of exs_init, exs_socket, exs_bind, exs_listen, exs_accept, exs_connect, exs_close,
 * exs_send, exs_recv, exs_sendmsg, exs_recvmsg, exs_shutdown, exs_mregister, exs_mderegister, exs_qcreate, exs_qdelete,
 * exs_qdequeue, exs_qmodify, exs_qstatus, exs_fcntl, the handle types, the EXS_EVT_*,
 * EXS_QATTR_* and EXS_WAIT_* names, and the signatures of exs_init, exs_qcreate,
 * exs_mregister, exs_send, exs_recv and exs_qdequeue. Their exact texts are not public:
 * everything else below marked [Courier] is this library's choice, among it the layout of
 * exs_event_t, every constant's value, the exs_fcntl commands, the signatures of
 * exs_accept, exs_connect, exs_close, exs_sendmsg, exs_recvmsg, exs_qmodify and
 * exs_qstatus, exs_shutdown being synchronous, and the additions
 * exs_qfd, exs_getsockname, exs_getpeername, exs_getsockopt and exs_last_error_detail.
 *
 * Errors: calls return -1 (handles: EXS_QHANDLE_INVALID, EXS_MHANDLE_INVALID) with errno
 * set, and exs_last_error_detail() gives the sentence. An operation that started and then
 * failed reports it in its event: exs_evt_result = -errno, exs_evt_errno = errno.
 *   EINVAL  bad argument, unknown queue or registration handle (never made, or deleted),
 *           exs_init not called
 *   EFAULT  a buffer (an iovec) not inside the registration given with it
 *   EMSGSIZE more than EXS_IOV_MAX iovecs (exs_sendmsg, exs_recvmsg)
 *   ENOBUFS exs_recvmsg's staging buffers are used up
 *   EAGAIN  the event queue has no free slot (events waiting + operations in flight reach
 *           its depth), or 256 sends already wait for the peer's credits/advertisements
 *   EBUSY   exs_mderegister / exs_qdelete while operations in flight use it
 *   ENOTCONN, EISCONN, EPIPE (the peer closed), ECONNRESET (the peer died or the
 *           connection broke: pending operations too), ECONNREFUSED (CONNECT event),
 *           ECANCELED (pending when exs_close was called), EPIPE also after exs_shutdown
 *           SHUT_WR or the peer's SHUT_RD, EPROTO (the peer broke the
 *           protocol: the connection is reset), EOPNOTSUPP (flags not supported)
 */
#ifndef COURIER_EXS_H
#define COURIER_EXS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/* exs_init's argument. [Courier: the value] */
#define EXS_VERSION 1

/* An event queue. */
typedef int exs_qhandle_t;
#define EXS_QHANDLE_INVALID (-1)
/* A memory registration. Handles are never reused. [Courier: the type] */
typedef uint64_t exs_mhandle_t;
#define EXS_MHANDLE_INVALID ((exs_mhandle_t)0)
/* The caller's word, handed back in the operation's event. [Courier: the type] */
typedef void *exs_ahandle_t;

/* Event types. [Courier: the values] */
#define EXS_EVT_CONNECT 1
#define EXS_EVT_ACCEPT 2
#define EXS_EVT_SEND 3
#define EXS_EVT_RECV 4
#define EXS_EVT_SENDMSG 5
#define EXS_EVT_RECVMSG 6
#define EXS_EVT_SHUTDOWN 7 /* reserved: exs_shutdown is synchronous (see there) */
#define EXS_EVT_CLOSE 8

/* One completed operation. [Courier: the layout] */
typedef struct exs_event {
    int exs_evt_type;               /* EXS_EVT_* */
    int exs_evt_fd;                 /* the descriptor the operation was started on */
    exs_ahandle_t exs_evt_ahandle;  /* the caller's word */
    ssize_t exs_evt_result;         /* SEND/RECV, SENDMSG/RECVMSG: bytes (RECV: 0 with
                                     * EXS_MSG_EOF = end of stream);
                                     * ACCEPT: the new descriptor; CONNECT, CLOSE: 0;
                                     * failure: -errno */
    int exs_evt_errno;              /* 0, or the errno of a failure */
    int exs_evt_flags;              /* RECV: MSG_TRUNC (a SEQPACKET message longer than the
                                     * buffer: the rest was dropped), MSG_EOR,
                                     * EXS_MSG_EOF (the end of the stream) */
    void *exs_evt_buf;              /* SEND/RECV: the buffer; SENDMSG/RECVMSG: the msghdr;
                                     * else NULL */
    size_t exs_evt_len;             /* SEND/RECV: the length asked for; SENDMSG/RECVMSG:
                                     * the iovecs' total; else 0 */
} exs_event_t;

/* exs_evt_flags of a RECV or RECVMSG that the end of the stream completed: the peer shut
 * its writing side down (exs_shutdown SHUT_WR, shutdown(2)) or closed, or we shut our
 * reading side down. The result is 0 (a STREAM MSG_WAITALL receive: what came before the
 * end), on both socket types: it tells an empty SEQPACKET message (0, no EXS_MSG_EOF)
 * from the end. On a kernel SEQPACKET socket the kernel does not tell them apart; it is
 * set when the reading side is shut (an empty message sent right before the peer's
 * shutdown reads as the end too); a message taken by a zero-length receive (0 with
 * MSG_TRUNC) never reads as the end, there or over Courier. Not a kernel MSG_* bit.
 * [Courier] */
#define EXS_MSG_EOF 0x10000000

/* Queue attributes (exs_qmodify, exs_qstatus). [Courier: the values; FD and RESERVED] */
#define EXS_QATTR_DEPTH 1    /* slots: events waiting + operations in flight (1..2^20) */
#define EXS_QATTR_SIGNAL 2   /* a signal raised (kill(getpid())) at each event; 0: none */
#define EXS_QATTR_EVENTS 3   /* read only: events waiting */
#define EXS_QATTR_WAIT 4     /* EXS_WAIT_*: how exs_qdequeue waits */
#define EXS_QATTR_FD 5       /* read only: the queue's descriptor (as exs_qfd) */
#define EXS_QATTR_RESERVED 6 /* read only: operations in flight that will post here */

/* How exs_qdequeue waits (EXS_QATTR_WAIT). [Courier: the values, DEFAULT] */
#define EXS_WAIT_DEFAULT 0   /* as exs_fcntl(EXS_F_BUSY_POLL) says (off: NOTIFY) */
#define EXS_WAIT_NOTIFY 1    /* sleep on the queue; the completion thread finds completions */
#define EXS_WAIT_BUSY_POLL 2 /* spin, finding completions in the waiting thread */
#define EXS_WAIT_ADAPTIVE 3  /* busy-poll for 50 us, then notify */

/* exs_fcntl commands. [Courier: the names and values]
 * Per socket, set before exs_connect/exs_listen (a listener's values go to the connections
 * it accepts; after that: EISCONN); both ends' values shape a connection:
 *   EXS_F_SMALL_MAX    largest "small packet": sent eagerly, without the peer's
 *                      advertisement, into its receive buffer (0..1 MiB, default 8192;
 *                      the smaller of the two ends' values applies)
 *   EXS_F_RCVBUF       SOCK_STREAM: bytes the peer may send us eagerly (default 256 KiB)
 *   EXS_F_NO_RCVBUF    SOCK_STREAM, 1: no receive buffer: every byte goes straight into a
 *                      posted, advertised buffer (direct placement only)
 *   EXS_F_SMALL_SLOTS  SOCK_SEQPACKET: small messages the peer may send us eagerly
 *                      (default 64)
 *   EXS_F_ADV_CREDITS  advertisements of our posted receives out at once (1..1024,
 *                      default 64)
 * Per socket, any time:
 *   EXS_F_INLINE_MAX   sends up to this size are copied by exs_send, whose SEND event is
 *                      queued at once (the buffer is free on return) (default 256)
 *   EXS_F_SPLIT_MIN    over shared memory, a send of at least this many bytes that fills a
 *                      whole advertised receive is copied by both processes, each a part,
 *                      at once (Courier's split rendezvous) instead of by the sender
 *                      alone; 0: never (default 256 KiB; it pays where the two processes
 *                      run on different cores)
 * Library-wide (fd is ignored; -1 is fine):
 *   EXS_F_BUSY_POLL    1: completions are found by busy-polling in the thread that waits in
 *                      exs_qdequeue; 0 (default): by the completion thread, which sleeps
 *                      until the transport wakes it, and the waiter sleeps on the queue
 *   EXS_F_CPU          the completion thread's CPU (-1: any)
 * OR EXS_F_GET into a command to read its value (the return value). */
#define EXS_F_SMALL_MAX 1
#define EXS_F_INLINE_MAX 2
#define EXS_F_CPU 3
#define EXS_F_BUSY_POLL 4
#define EXS_F_RCVBUF 5
#define EXS_F_NO_RCVBUF 6
#define EXS_F_ADV_CREDITS 7
#define EXS_F_SMALL_SLOTS 8
#define EXS_F_SPLIT_MIN 9
#define EXS_F_GET 0x100

/* exs_mregister flags (0 means both). [Courier] */
#define EXS_MREG_READ 1
#define EXS_MREG_WRITE 2

/* exs_getsockopt level and option: the transport of a connection, a string: "shm",
 * "tcp", "self" (both ends in one process), "none" (not connected), or "kernel" for a
 * kernel socket. [Courier] */
#define SOL_EXS 0x4558
#define EXS_SO_TRANSPORT 1

/* Start the library (once per process; later calls check the version only). */
int exs_init(int version);

/* The sentence of the last failure on this thread ("" if none). [Courier] */
const char *exs_last_error_detail(void);

/* ----- memory ------------------------------------------------------------------------ */

/* Register [addr, addr + len): buffers of exs_send and exs_recv must lie in the
 * registration given with them (EFAULT otherwise). A peer may write only into registered
 * memory, and only where our receives advertised it.
 *
 * [Courier] A registration of at least COURIER_EXS_SHARE_MIN bytes (64 KiB; "off": never)
 * in memory mapped for the buffer itself (a large malloc, an mmap; not the brk heap, a
 * bss, a stack or a file) moves, as RDMA registration pins, in whole pages: the pages
 * holding it become a shared segment at the same addresses with the same contents, which
 * a peer on shared memory writes and reads with plain loads and stores (not through the
 * kernel), and private memory again at exs_mderegister. While exs_mregister and
 * exs_mderegister run, no other thread may write those pages (the registration's first
 * and last pages whole); between the two, a child made by fork() shares them. */
exs_mhandle_t exs_mregister(void *addr, size_t len, int flags);
/* EBUSY while an operation in flight uses it. */
int exs_mderegister(exs_mhandle_t mh);

/* ----- event queues ------------------------------------------------------------------ */

/* A queue of depth slots: each operation holds one from its start to its event's
 * dequeue, so no completion is ever dropped. */
exs_qhandle_t exs_qcreate(int depth);
/* EBUSY while operations in flight will post to it; events not dequeued are dropped. */
int exs_qdelete(exs_qhandle_t qh);
/* n > 0: up to n events, waiting (up to timeout) for the first; n < 0: wait until at
 * least -n are there (or the timeout passes), then take up to -n. timeout NULL: no
 * limit; {0, 0}: no wait. Returns the number of events written to events. */
int exs_qdequeue(exs_qhandle_t qh, exs_event_t *events, int n, const struct timespec *timeout);
/* Change EXS_QATTR_DEPTH (not below what is in use: EBUSY), _WAIT, _SIGNAL. [Courier:
 * signature] */
int exs_qmodify(exs_qhandle_t qh, int attr, long value);
/* Read an attribute into *value. [Courier: signature] */
int exs_qstatus(exs_qhandle_t qh, int attr, long *value);
/* The queue's descriptor, readable exactly while events wait (for poll, select, epoll;
 * dequeue with exs_qdequeue, do not read it). Owned by the queue. [Courier] */
int exs_qfd(exs_qhandle_t qh);

/* ----- sockets ----------------------------------------------------------------------- */

/* An EXS socket: AF_INET or AF_INET6, SOCK_STREAM or SOCK_SEQPACKET (message boundaries
 * kept), protocol 0. It is a real descriptor the library owns (do not read, write or
 * close(2) it: exs_close it); any other descriptor given to the exs_ calls is taken as a
 * kernel socket. */
int exs_socket(int domain, int type, int protocol);
/* Port 0 picks one at exs_listen (exs_getsockname tells it). */
int exs_bind(int fd, const struct sockaddr *addr, socklen_t len);
int exs_listen(int fd, int backlog);
/* ACCEPT event: exs_evt_result is the new descriptor. addr/addrlen (may be NULL) get the
 * peer's address before the event is queued: keep them valid until then. [Courier:
 * signature] */
int exs_accept(int fd, struct sockaddr *addr, socklen_t *addrlen, exs_qhandle_t qh,
               exs_ahandle_t ahandle);
/* CONNECT event: 0, or -ECONNREFUSED and the like. [Courier: signature] */
int exs_connect(int fd, const struct sockaddr *addr, socklen_t len, exs_qhandle_t qh,
                exs_ahandle_t ahandle);
/* Close: operations still pending complete with ECANCELED (receives only once the peer
 * has promised to write into them no more), the peer's receives see the end of the
 * stream after everything sent. The descriptor is released at once; with a queue (not
 * EXS_QHANDLE_INVALID), a CLOSE event says when all is done. A kernel socket is closed
 * with close(2). [Courier: signature] */
int exs_close(int fd, exs_qhandle_t qh, exs_ahandle_t ahandle);

/* Shut a connected socket down, as shutdown(2): how is SHUT_RD, SHUT_WR or SHUT_RDWR.
 * Synchronous, as shutdown(2) is: nothing to wait for (it queues the end of the stream
 * and returns); the ES-API extends only the calls that wait on the network, so no queue
 * and no event (EXS_EVT_SHUTDOWN stays reserved). [Courier: synchronous]
 *   SHUT_WR  the sends already started complete first, then the peer learns the end of
 *            the stream: its pending and later receives complete with 0 and EXS_MSG_EOF,
 *            after every byte (STREAM) or message (SEQPACKET) sent before. Our later sends
 *            fail with EPIPE; our receiving side stays open (half close). On a kernel
 *            socket, shutdown(2) waits here for the sends queued before it (it never
 *            overtakes them).
 *   SHUT_RD  receives take what has already arrived, then complete with 0 and EXS_MSG_EOF
 *            (pending ones too, as soon as the peer has promised to write into their
 *            buffers no more), as recv(2) returns 0 after shutdown(SHUT_RD). Over Courier
 *            the peer's later sends fail with EPIPE (as on a Unix socket; kernel TCP
 *            accepts and drops them).
 * Errors: EBADF, ENOTSOCK, EINVAL (how), ENOTCONN (not connected, or the connection
 * broke). Shutting a side down twice is no error. */
int exs_shutdown(int fd, int how);

/* Start a send of len bytes at buf, inside registration mh (mh may be EXS_MHANDLE_INVALID
 * only with len 0). Returns 0 when started. flags: MSG_NOSIGNAL, MSG_DONTWAIT (both
 * implied), MSG_MORE, MSG_EOR (kernel sockets). SEND event: the bytes sent. */
int exs_send(int fd, void *buf, size_t len, int flags, exs_qhandle_t qh,
             exs_ahandle_t ahandle, exs_mhandle_t mh);
/* Start a receive into buf. flags: MSG_WAITALL (SOCK_STREAM: complete only when len bytes
 * came, or at the end of the stream). RECV event: bytes received (0: end of stream),
 * MSG_TRUNC in exs_evt_flags for a SOCK_SEQPACKET message longer than len (the rest is
 * dropped). Receives complete in the order they were posted.
 * len 0 (buf may then be NULL and mh EXS_MHANDLE_INVALID; exs_recvmsg over empty iovecs
 * alike): SOCK_SEQPACKET takes the next message whole and places nothing: 0 with
 * MSG_TRUNC (an empty message: 0 without it), as recvmsg(2) does, and the next receive
 * gets the next message; SOCK_STREAM completes at once with 0. [Courier: over Courier it
 * is advertised as 0 bytes of a registration of the library's own, which no handle of
 * the caller's names] */
int exs_recv(int fd, void *buf, size_t len, int flags, exs_qhandle_t qh,
             exs_ahandle_t ahandle, exs_mhandle_t mh);

/* Scatter/gather: exs_send and exs_recv over the iovecs msg->msg_iov[0 .. msg_iovlen), in
 * order: SOCK_SEQPACKET, one message made of all of them (gathered into one put-with-
 * signal over Courier); SOCK_STREAM, their bytes. [Courier: the parameter list, exs_send's
 * with a msghdr; the completion's msg_flags]
 *   - at most EXS_IOV_MAX iovecs (EMSGSIZE); msg NULL, or msg_iov NULL with
 *     msg_iovlen > 0: EFAULT; lengths adding up past SSIZE_MAX: EINVAL;
 *   - every non-empty iovec inside registration mh (EFAULT otherwise; mh may be
 *     EXS_MHANDLE_INVALID only when there are no bytes);
 *   - msg_name is ignored (the socket is connected, as Linux ignores it there);
 *     exs_sendmsg refuses ancillary data (msg_controllen != 0: EOPNOTSUPP);
 *   - flags: as exs_send / exs_recv.
 * exs_sendmsg reads msg and its iovec array during the call only; the data must stay
 * untouched until the SENDMSG event (result: the bytes sent; exs_evt_buf: msg).
 * exs_recvmsg reads the iovec array during the call; msg must stay valid until the RECVMSG
 * event, before which msg_flags is written (MSG_TRUNC: a SEQPACKET message longer than
 * the iovecs, its rest dropped; EXS_MSG_EOF), msg_controllen and msg_namelen set to 0.
 * Result: the bytes received (0 with EXS_MSG_EOF: the end); exs_evt_buf: msg;
 * exs_evt_flags: as msg_flags. Over Courier a receive into several iovecs (not adjacent
 * in memory) is placed in a registered staging buffer of the library's and copied into
 * them at completion (ENOBUFS when 64 MiB of those are in use); into one, directly. */
#define EXS_IOV_MAX 1024 /* Linux's IOV_MAX [Courier] */
int exs_sendmsg(int fd, const struct msghdr *msg, int flags, exs_qhandle_t qh,
                exs_ahandle_t ahandle, exs_mhandle_t mh);
int exs_recvmsg(int fd, struct msghdr *msg, int flags, exs_qhandle_t qh, exs_ahandle_t ahandle,
                exs_mhandle_t mh);

/* Tuning: see EXS_F_*. Returns the value read (EXS_F_GET) or 0. [Courier: signature] */
long exs_fcntl(int fd, int cmd, long arg);

/* As getsockname(2), getpeername(2), getsockopt(2), for EXS and kernel sockets. EXS
 * sockets answer SOL_SOCKET's SO_TYPE, SO_DOMAIN, SO_ERROR, SO_RCVBUF, SO_ACCEPTCONN and
 * SOL_EXS's EXS_SO_TRANSPORT. [Courier] */
int exs_getsockname(int fd, struct sockaddr *addr, socklen_t *len);
int exs_getpeername(int fd, struct sockaddr *addr, socklen_t *len);
int exs_getsockopt(int fd, int level, int name, void *val, socklen_t *len);

#ifdef __cplusplus
}
#endif

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && defined(__x86_64__)
_Static_assert(sizeof(exs_event_t) == 48, "exs_event_t layout differs from the library's");
#endif

#endif /* COURIER_EXS_H */
