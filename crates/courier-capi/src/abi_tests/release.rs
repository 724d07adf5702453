//! Every kind of handle is released by its `courier_<object>_destroy`; the older names
//! stay as aliases of the same calls.

use super::*;

/// Create one handle of each kind and release each with its `_destroy`.
#[test]
fn every_handle_kind_is_released_by_its_destroy() {
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    unsafe {
        let (ctx, w) = ctx_worker(c"all");
        let ep = self_ep(w);
        let mp = alloc_params(4096);
        let mut mem = null_mut();
        assert_eq!(courier_mem_map(ctx, &mp, &mut mem), COURIER_OK);
        let (mut kb, mut kl) = (null_mut(), 0usize);
        assert_eq!(courier_rkey_pack(mem, &mut kb, &mut kl), COURIER_OK);
        let mut rk = null_mut();
        assert_eq!(courier_ep_rkey_unpack(ep, kb, kl, &mut rk), COURIER_OK);
        courier_buffer_free(kb);
        let mut sem = null_mut();
        assert_eq!(courier_sem_create(ctx, 0, &mut sem), COURIER_OK);

        // A request in flight: a receive nothing will match.
        let mut buf = [0u8; 8];
        let mut req = null_mut();
        let st = courier_worker_tag_recv(
            w,
            buf.as_mut_ptr().cast(),
            buf.len(),
            77,
            u64::MAX,
            null(),
            &mut req,
        );
        assert_eq!(st, COURIER_INPROGRESS);
        assert_eq!(courier_request_cancel(req), COURIER_OK);
        assert_eq!(courier_request_destroy(req), COURIER_OK);

        // A descriptor that is not one is refused, not freed.
        assert_eq!(
            courier_am_desc_destroy(w, null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );

        assert_eq!(courier_sem_destroy(sem), COURIER_OK);
        assert_eq!(courier_rkey_destroy(rk), COURIER_OK);
        assert_eq!(courier_mem_destroy(mem), COURIER_OK);
        assert_eq!(courier_ep_destroy(ep), COURIER_OK);
        assert_eq!(courier_worker_destroy(w), COURIER_OK);
        assert_eq!(courier_context_destroy(ctx), COURIER_OK);
        // NULL does nothing and says so.
        assert_eq!(courier_mem_destroy(null_mut()), COURIER_ERR_INVALID_HANDLE);
        assert_eq!(
            courier_request_destroy(null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );
    }
}
