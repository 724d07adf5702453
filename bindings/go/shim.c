/* C side of the Go binding: slots, batches, and the callbacks the library calls. See
 * shim.h for the design. */
#include <string.h>

#include "shim.h"

/* The batch of the progress call running on this thread, if any. */
static __thread cg_batch_t *cg_cur;

static void cg_complete(courier_status_t status, const courier_request_info_t *info, void *user_data);

cg_slot_t *cg_slots_new(uint32_t first, uint32_t count, uintptr_t worker) {
	cg_slot_t *s = calloc(count, sizeof(cg_slot_t));
	if (s == NULL)
		return NULL;
	for (uint32_t i = 0; i < count; i++) {
		s[i].index = first + i;
		s[i].worker = worker;
		s[i].params.field_mask = COURIER_OP_FIELD_CALLBACK | COURIER_OP_FIELD_USER_DATA | COURIER_OP_FIELD_INFO;
		s[i].params.cb = cg_complete;
		s[i].params.user_data = &s[i];
		s[i].params.info = &s[i].info;
	}
	return s;
}

cg_batch_t *cg_batch_new(uintptr_t worker) {
	cg_batch_t *b = calloc(1, sizeof(cg_batch_t));
	if (b != NULL)
		b->worker = worker;
	return b;
}

/* The current batch if it collects events of worker (a callback of another worker's
 * progress, run inside this one's, goes to Go directly). */
static cg_batch_t *cg_batch_for(uintptr_t worker) {
	cg_batch_t *b = cg_cur;
	return b != NULL && b->worker == worker ? b : NULL;
}

static void cg_batch_reap(cg_batch_t *b) {
	for (uint32_t i = 0; i < b->ndead; i++)
		courier_request_free(b->dead[i]);
	b->ndead = 0;
}

void cg_batch_free(cg_batch_t *b) {
	if (b == NULL)
		return;
	cg_batch_reap(b);
	free(b->ev);
	free(b->arena);
	free(b);
}

static cg_event_t *cg_batch_push(cg_batch_t *b) {
	if (b->n == b->cap) {
		uint32_t cap = b->cap ? b->cap * 2 : 64;
		cg_event_t *ev = realloc(b->ev, (size_t)cap * sizeof(cg_event_t));
		if (ev == NULL)
			return NULL;
		b->ev = ev;
		b->cap = cap;
	}
	return &b->ev[b->n++];
}

/* Room for n more arena bytes; NULL only if there is no memory for them. Also for n == 0
 * (a rendezvous message with an empty header): the arena is made on first use, so that
 * an empty reservation is a real address and not NULL, which would read as out of memory
 * (and send the message to a direct call, where a handler cannot wait for its data). */
static unsigned char *cg_batch_reserve(cg_batch_t *b, size_t n) {
	if (b->arena == NULL || b->arena_cap - b->used < n) {
		size_t cap = b->arena_cap ? b->arena_cap : 4096;
		while (cap - b->used < n)
			cap *= 2;
		unsigned char *a = realloc(b->arena, cap);
		if (a == NULL)
			return NULL;
		b->arena = a;
		b->arena_cap = cap;
	}
	return b->arena + b->used;
}

uint32_t cg_progress(uintptr_t worker, uintptr_t batch) {
	const courier_worker_t *w = (const courier_worker_t *)worker;
	cg_batch_t *b = (cg_batch_t *)batch;
	if (b->ndead)
		cg_batch_reap(b);
	b->prev = cg_cur;
	cg_cur = b;
	uint32_t n = 0;
	for (int i = 0; i < CG_PROGRESS_POLLS && n == 0; i++)
		n = courier_worker_progress(w);
	cg_cur = b->prev;
	b->prev = NULL;
	return n;
}

static void cg_complete(courier_status_t status, const courier_request_info_t *info, void *user_data) {
	cg_slot_t *s = user_data;
	s->status = status;
	s->info = *info;
	if (status < 0) {
		const char *d = courier_last_error_detail();
		s->detail = d ? strdup(d) : NULL;
	}
	cg_batch_t *b = cg_batch_for(s->worker);
	cg_event_t *ev = b ? cg_batch_push(b) : NULL;
	if (ev == NULL) {
		courierGoDone(s);
		return;
	}
	ev->kind = CG_EV_DONE;
	ev->slot = s->index;
}

static courier_status_t cg_am(const courier_am_recv_param_t *p, void *user_data) {
	cg_batch_t *b = cg_batch_for((uintptr_t)user_data);
	int rndv = (p->flags & COURIER_AM_RECV_FLAG_RNDV) != 0;
	/* A rendezvous message's bytes stay at the sender: only its header is copied. */
	size_t copy = p->header_length + (rndv ? 0 : p->data_length);
	if (b != NULL && (p->flags & COURIER_AM_RECV_FLAG_REPLY) == 0 && copy <= CG_AM_BATCH_MAX) {
		unsigned char *dst = cg_batch_reserve(b, copy);
		cg_event_t *ev = dst ? cg_batch_push(b) : NULL;
		if (ev != NULL) {
			if (p->header_length)
				memcpy(dst, p->header, p->header_length);
			if (!rndv && p->data_length)
				memcpy(dst + p->header_length, p->data, p->data_length);
			ev->kind = rndv ? CG_EV_RNDV : CG_EV_AM;
			ev->id = p->id;
			ev->off = b->used;
			ev->header_length = p->header_length;
			ev->data_length = p->data_length;
			ev->desc = rndv ? p->desc : NULL;
			b->used += copy;
			/* Keeps the descriptor: Go receives or releases it when it delivers the batch. */
			return rndv ? COURIER_INPROGRESS : COURIER_OK;
		}
	}
	return courierGoAM((void *)p, (uintptr_t)user_data, b);
}

static void cg_ep_error(courier_ep_t *ep, courier_status_t status, void *user_data) {
	courierGoEpError(ep, status, (uintptr_t)user_data, cg_cur);
}

static void cg_conn(courier_conn_request_t *req, void *user_data) {
	courierGoConn(req, (uintptr_t)user_data, cg_cur);
}

void cg_slot_fail(cg_slot_t *slot, courier_status_t status) {
	if (status >= 0)
		return;
	const char *d = courier_last_error_detail();
	slot->detail = d ? strdup(d) : NULL;
}

courier_status_t cg_am_send(uintptr_t e, uint16_t id, uintptr_t h, size_t header_length, uintptr_t d, size_t length,
			    uint32_t flags, uintptr_t sl, int copied) {
	const courier_ep_t *ep = (const courier_ep_t *)e;
	cg_slot_t *slot = (cg_slot_t *)sl;
	const void *header = (const void *)h, *data = (const void *)d;
	if (copied) {
		header = header_length ? slot->scratch : NULL;
		data = length ? slot->scratch + header_length : NULL;
	}
	courier_status_t s = courier_ep_am_send(ep, id, header, header_length, data, length, flags, &slot->params, &slot->req);
	cg_slot_fail(slot, s);
	return s;
}

courier_status_t cg_tag_send(uintptr_t e, uintptr_t d, size_t length, uint64_t tag, int sync, uintptr_t sl,
			     int copied) {
	const courier_ep_t *ep = (const courier_ep_t *)e;
	cg_slot_t *slot = (cg_slot_t *)sl;
	const void *data = (const void *)d;
	if (copied)
		data = length ? slot->scratch : NULL;
	courier_status_t s = sync ? courier_ep_tag_send_sync(ep, data, length, tag, &slot->params, &slot->req)
				  : courier_ep_tag_send(ep, data, length, tag, &slot->params, &slot->req);
	cg_slot_fail(slot, s);
	return s;
}

courier_status_t cg_stream_send(uintptr_t e, uintptr_t d, size_t length, uintptr_t sl, int copied) {
	const courier_ep_t *ep = (const courier_ep_t *)e;
	cg_slot_t *slot = (cg_slot_t *)sl;
	const void *data = (const void *)d;
	if (copied)
		data = length ? slot->scratch : NULL;
	courier_status_t s = courier_ep_stream_send(ep, data, length, &slot->params, &slot->req);
	cg_slot_fail(slot, s);
	return s;
}

courier_status_t cg_am_recv_data(uintptr_t w, uintptr_t desc, uintptr_t buf, size_t length, uintptr_t sl) {
	cg_slot_t *slot = (cg_slot_t *)sl;
	courier_status_t s = courier_worker_am_recv_data((const courier_worker_t *)w, (courier_am_desc_t *)desc,
							 (void *)buf, length, &slot->params, &slot->req);
	cg_slot_fail(slot, s);
	return s;
}

courier_status_t cg_set_am_handler(const courier_worker_t *w, uint16_t id, uintptr_t worker) {
	return courier_worker_set_am_handler(w, id, cg_am, (void *)worker);
}

void cg_ep_err(courier_ep_params_t *p, uintptr_t h) {
	p->field_mask |= COURIER_EP_FIELD_ERR_HANDLER | COURIER_EP_FIELD_USER_DATA;
	p->err_handler = cg_ep_error;
	p->user_data = (void *)h;
}

void cg_listener_handler(courier_listener_params_t *p, uintptr_t h) {
	p->field_mask |= COURIER_LISTENER_FIELD_CONN_HANDLER | COURIER_LISTENER_FIELD_USER_DATA;
	p->conn_handler = cg_conn;
	p->user_data = (void *)h;
}

courier_status_t cg_cancel(const courier_request_t *req, cg_batch_t *b) {
	b->prev = cg_cur;
	cg_cur = b;
	courier_status_t s = courier_request_cancel(req);
	cg_cur = b->prev;
	b->prev = NULL;
	return s;
}

courier_iov_t *cg_iov_alloc(size_t n) { return (courier_iov_t *)calloc(n ? n : 1, sizeof(courier_iov_t)); }

void cg_iov_set(courier_iov_t *iov, size_t i, void *p, size_t len) {
	iov[i].buffer = p;
	iov[i].length = len;
}
