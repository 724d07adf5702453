/* C shims for the Go binding: callback pointers to the exported Go functions, and
 * handles turned into void *user_data on the C side. Included by every Go file that
 * calls them, except callbacks.go (files with //export may only declare). */
#ifndef COURIER_GO_SHIM_H
#define COURIER_GO_SHIM_H

#include <stdint.h>
#include <stdlib.h>
#include <courier.h>

// Go functions exported in callbacks.go (declared here; the types match courier.h's
// callback typedefs up to const, hence the casts below).
extern void courierGoCompletion(courier_status_t, courier_request_info_t *, void *);
extern courier_status_t courierGoAM(courier_am_recv_param_t *, void *);
extern void courierGoEpError(courier_ep_t *, courier_status_t, void *);
extern void courierGoConn(courier_conn_request_t *, void *);

// Handles cross into C as integers and become void *user_data only here, so Go never
// converts an integer to unsafe.Pointer.
static inline void *cg_ud(uintptr_t h) { return (void *)h; }

static inline courier_op_params_t cg_op(uintptr_t h) {
	courier_op_params_t p;
	p.field_mask = COURIER_OP_FIELD_CALLBACK | COURIER_OP_FIELD_USER_DATA | COURIER_OP_FIELD_INFO;
	p.cb = (courier_completion_cb_t)courierGoCompletion;
	p.user_data = (void *)h;
	p.info = NULL;
	return p;
}

static inline courier_status_t cg_set_am_handler(courier_worker_t *w, uint16_t id, uintptr_t h) {
	return courier_worker_set_am_handler(w, id, (courier_am_cb_t)courierGoAM, (void *)h);
}

static inline void cg_ep_err(courier_ep_params_t *p, uintptr_t h) {
	p->field_mask |= COURIER_EP_FIELD_ERR_HANDLER | COURIER_EP_FIELD_USER_DATA;
	p->err_handler = (courier_ep_error_cb_t)courierGoEpError;
	p->user_data = (void *)h;
}

static inline void cg_listener_handler(courier_listener_params_t *p, uintptr_t h) {
	p->field_mask |= COURIER_LISTENER_FIELD_CONN_HANDLER | COURIER_LISTENER_FIELD_USER_DATA;
	p->conn_handler = (courier_conn_handler_cb_t)courierGoConn;
	p->user_data = (void *)h;
}

static inline courier_iov_t *cg_iov_alloc(size_t n) {
	return (courier_iov_t *)calloc(n ? n : 1, sizeof(courier_iov_t));
}

static inline void cg_iov_set(courier_iov_t *iov, size_t i, void *p, size_t len) {
	iov[i].buffer = p;
	iov[i].length = len;
}
#endif
