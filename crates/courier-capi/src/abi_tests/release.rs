//! Every kind of handle is released by its `courier_<object>_destroy`; the older names
//! stay as aliases of the same calls.

use super::*;

/// Create one handle of each kind and release each with its `_destroy`.
#[test]
fn every_handle_kind_is_released_by_its_destroy() {
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    unsafe {
        let (p, _cfg) = tls(c"all");
        let mut ctx = null_mut();
        assert_eq!(courier_context_create(&p, &mut ctx), COURIER_OK);
        let mut w = null_mut();
        assert_eq!(courier_worker_create(ctx, null(), &mut w), COURIER_OK);
        let (mut addr, mut len) = (null_mut(), 0usize);
        assert_eq!(courier_worker_address(w, &mut addr, &mut len), COURIER_OK);
        let ep_p = courier_ep_params_t {
            field_mask: COURIER_EP_FIELD_REMOTE_ADDRESS,
            address: addr,
            address_length: len,
            sockaddr: null(),
            client_id: 0,
            err_handler: None,
            user_data: null_mut(),
        };
        let mut ep = null_mut();
        assert_eq!(courier_ep_create(w, &ep_p, &mut ep), COURIER_OK);
        courier_buffer_free(addr);
        assert_eq!(courier_ep_wait_connected(ep, 5000), COURIER_OK);

        let mp = courier_mem_map_params_t {
            field_mask: COURIER_MEM_MAP_FIELD_LENGTH | COURIER_MEM_MAP_FIELD_FLAGS,
            address: null_mut(),
            length: 4096,
            flags: COURIER_MEM_MAP_FLAG_ALLOCATE,
            memory_type: COURIER_MEMORY_TYPE_HOST,
            access: 0,
        };
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
