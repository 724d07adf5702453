/* C side of the Go binding (definitions in shim.c).
 *
 * Two things keep the data path cheap:
 *
 * - Slots. Every operation uses one slot of its worker's slab: C memory holding the op
 *   params (callback cg_complete, user_data = the slot itself), the info, the request the
 *   library hands back, and a scratch area that small sends are copied into (so their Go
 *   buffer needs no pinning and is never kept by C). Go finds its *Request by slot index;
 *   no cgo.Handle per operation.
 *
 * - Batches. Go progresses through cg_progress, which makes a batch (C memory owned by the
 *   caller) the calling thread's current one. While it is current, completions, small
 *   eager active messages (their bytes copied into its arena) and rendezvous active
 *   messages (their header copied, their descriptor kept by returning COURIER_INPROGRESS)
 *   are appended to it instead of calling into Go; Go delivers them after cg_progress
 *   returns, so a progress call crosses into Go only for the events that must run inside
 *   the library (messages that allow a reply, whose reply endpoint is lent for the
 *   handler; large eager messages; endpoint errors; connection requests). Those call Go
 *   directly with the current batch, which Go delivers first, so every event is seen in
 *   the library's order. A completion that runs where no batch is current (a cancel, a
 *   flush or close that progresses) calls Go directly.
 *
 * Nothing here is included by callbacks.go: a file with //export may only declare, and
 * the Go functions below are declared here with the parameter types C code uses. */
#ifndef COURIER_GO_SHIM_H
#define COURIER_GO_SHIM_H

#include <stdint.h>
#include <stdlib.h>
#include <courier.h>

/* Sends of at most this many bytes (header included for active messages) are copied into
 * the slot. */
#define CG_SCRATCH 256
/* Eager active messages of at most this many bytes (header + data), and rendezvous ones
 * whose header is at most this long, are batched; larger ones are delivered by a direct
 * call (one copy instead of two). */
#define CG_AM_BATCH_MAX 4096

typedef struct cg_slot {
	courier_op_params_t params;
	courier_request_info_t info;
	courier_request_t *req; /* written by the starting call when it returns INPROGRESS */
	uintptr_t worker;       /* the Go worker's cgo.Handle (for completions without a batch) */
	char *detail;           /* strdup'd failure detail, freed by Go */
	uint32_t index;
	int32_t status;
	unsigned char scratch[CG_SCRATCH];
} cg_slot_t;

/* CG_EV_AM: an eager message, header and data in the arena. CG_EV_RNDV: a rendezvous
 * message, its header in the arena and its data at the sender behind desc (kept: Go
 * receives or releases it). */
enum { CG_EV_DONE = 1, CG_EV_AM = 2, CG_EV_RNDV = 3 };

typedef struct {
	uint32_t kind;
	uint32_t slot;   /* CG_EV_DONE: the slot index */
	uint16_t id;     /* CG_EV_AM, CG_EV_RNDV: handler id; header at arena+off, data right after */
	size_t off, header_length, data_length;
	courier_am_desc_t *desc; /* CG_EV_RNDV */
} cg_event_t;

/* Requests Go finished while delivering a batch, freed by the batch's next progress call
 * (or when the batch is freed) rather than by a call of their own. */
#define CG_DEAD_MAX 64

typedef struct cg_batch {
	cg_event_t *ev;
	uint32_t n, cap;
	uint32_t head;         /* the next event Go delivers */
	unsigned char *arena;
	size_t used, arena_cap;
	struct cg_batch *prev; /* the batch current before this one (nested progress) */
	uintptr_t worker;      /* the Go worker's cgo.Handle: only its events go here */
	uint32_t ndead;
	courier_request_t *dead[CG_DEAD_MAX];
} cg_batch_t;

cg_slot_t *cg_slots_new(uint32_t first, uint32_t count, uintptr_t worker);
cg_batch_t *cg_batch_new(uintptr_t worker);
void cg_batch_free(cg_batch_t *b);

/* The calls on the data path take the C objects (worker, endpoint, slot, batch) as
 * uintptr_t: cgo checks every pointer argument for Go pointers, which costs more than the
 * call itself, and these are C memory. Only Go buffers are passed as pointers. */

/* Progresses up to CG_PROGRESS_POLLS times, until something happened: a Go loop of
 * Progress calls then notices an arrival about as soon as a C loop would, instead of once
 * per cgo call (which costs several times an idle progress). */
#define CG_PROGRESS_POLLS 8
uint32_t cg_progress(uintptr_t worker, uintptr_t batch);

/* Sends through a slot. copied != 0: Go copied the header and the data into the slot's
 * scratch (header first), and header and data are ignored; so no Go pointer reaches the
 * library. Otherwise the data is pinned until completion and the header (copied by the
 * library at once) kept alive across the call, so both pass as integers. On failure the
 * detail is stored in slot->detail. They never call Go. */
courier_status_t cg_am_send(uintptr_t ep, uint16_t id, uintptr_t header, size_t header_length, uintptr_t data,
			    size_t length, uint32_t flags, uintptr_t slot, int copied);
courier_status_t cg_tag_send(uintptr_t ep, uintptr_t data, size_t length, uint64_t tag, int sync, uintptr_t slot,
			     int copied);
courier_status_t cg_stream_send(uintptr_t ep, uintptr_t data, size_t length, uintptr_t slot, int copied);
/* Receives a rendezvous message's data into buf (Go memory pinned by the caller, or C
 * memory) through a slot. */
courier_status_t cg_am_recv_data(uintptr_t worker, uintptr_t desc, uintptr_t buf, size_t length, uintptr_t slot);
/* Stores the calling thread's failure detail in the slot (for other starting calls). */
void cg_slot_fail(cg_slot_t *slot, courier_status_t status);

courier_status_t cg_set_am_handler(const courier_worker_t *w, uint16_t id, uintptr_t worker);
void cg_ep_err(courier_ep_params_t *p, uintptr_t h);
void cg_listener_handler(courier_listener_params_t *p, uintptr_t h);
/* Cancel with b as the current batch (the cancel may complete the request at once). */
courier_status_t cg_cancel(const courier_request_t *req, cg_batch_t *b);

courier_iov_t *cg_iov_alloc(size_t n);
void cg_iov_set(courier_iov_t *iov, size_t i, void *p, size_t len);

/* Go functions exported in callbacks.go. */
extern void courierGoDone(void *slot);
extern courier_status_t courierGoAM(void *param, uintptr_t worker, void *batch);
extern void courierGoEpError(void *ep, courier_status_t status, uintptr_t h, void *batch);
extern void courierGoConn(void *req, uintptr_t h, void *batch);
#endif
