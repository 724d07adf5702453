//! `courier_request_finish` and `courier_request_wait_timeout`; the detail holds no status text.

use super::*;

unsafe fn recv(
    s: &Setup,
    buf: &mut [u8],
    tag: u64,
    info: &mut courier_request_info_t,
) -> (courier_status_t, *mut courier_request_t) {
    let op = courier_op_params_t {
        field_mask: COURIER_OP_FIELD_INFO,
        cb: None,
        user_data: null_mut(),
        info,
    };
    let mut req = null_mut();
    // SAFETY: the worker lives in `s`; `buf` and `info` outlive the request (the tests
    // finish it before they go).
    let st = unsafe {
        courier_worker_tag_recv(
            s.w,
            buf.as_mut_ptr().cast(),
            buf.len(),
            tag,
            u64::MAX,
            &op,
            &mut req,
        )
    };
    (st, req)
}

unsafe fn send(s: &Setup, msg: &[u8], tag: u64) {
    // SAFETY: the endpoint lives in `s`; `msg` outlives the send, finished here.
    unsafe {
        let mut req = null_mut();
        let st = courier_ep_tag_send(s.ep, msg.as_ptr().cast(), msg.len(), tag, null(), &mut req);
        assert_eq!(courier_request_finish(st, req, null_mut()), COURIER_OK);
    }
}

#[test]
fn finish_gives_the_info_whichever_way_the_operation_completed() {
    let s = Setup::new();
    // SAFETY: every handle lives in `s`, and every buffer outlives its request.
    unsafe {
        // Posted before the message: INPROGRESS; finish waits, writes info, frees.
        let mut buf = [0u8; 16];
        let mut info = courier_request_info_t::default();
        let (st, req) = recv(&s, &mut buf, 1, &mut info);
        assert_eq!(st, COURIER_INPROGRESS);
        send(&s, b"posted", 1);
        assert_eq!(courier_request_finish(st, req, &mut info), COURIER_OK);
        assert_eq!((info.length, info.tag), (6, 1));

        // The message arrived first: the receive completes at once (OK, no request) and the
        // operation wrote info; finish returns OK and leaves it.
        send(&s, b"unexpected!", 2);
        let mut probe = courier_request_info_t::default();
        for _ in 0..1000 {
            if courier_worker_tag_probe(s.w, 2, u64::MAX, &mut probe) == COURIER_OK {
                break;
            }
            courier_worker_progress(s.w);
        }
        let mut info = courier_request_info_t::default();
        let (st, req) = recv(&s, &mut buf, 2, &mut info);
        assert_eq!(st, COURIER_OK);
        assert!(req.is_null());
        assert_eq!(courier_request_finish(st, req, &mut info), COURIER_OK);
        assert_eq!((info.length, info.tag), (11, 2));
        assert_eq!(&buf[..11], b"unexpected!");

        // A failure is passed through, and a failed completion still reports its info.
        assert_eq!(
            courier_request_finish(COURIER_ERR_INVALID_PARAM, null_mut(), &mut info),
            COURIER_ERR_INVALID_PARAM
        );
        let mut small = [0u8; 2];
        let mut info = courier_request_info_t::default();
        let (st, req) = recv(&s, &mut small, 3, &mut info);
        send(&s, b"too long", 3);
        assert_eq!(
            courier_request_finish(st, req, &mut info),
            COURIER_ERR_MESSAGE_TRUNCATED
        );
        assert_eq!(info.length, 8);
    }
}

#[test]
fn wait_timeout_returns_with_the_request_in_flight() {
    let s = Setup::new();
    // SAFETY: every handle lives in `s`, and every buffer outlives its request.
    unsafe {
        let mut buf = [0u8; 8];
        let mut info = courier_request_info_t::default();
        let (st, req) = recv(&s, &mut buf, 4, &mut info);
        assert_eq!(st, COURIER_INPROGRESS);
        let t = std::time::Instant::now();
        assert_eq!(courier_request_wait_timeout(req, 50), COURIER_ERR_TIMEOUT);
        assert!(t.elapsed() >= std::time::Duration::from_millis(50));
        let detail = cstr(courier_last_error_detail());
        assert!(detail.contains("still in flight"), "{detail}");
        // The detail is the sentence alone: the status text is courier_status_string's.
        assert!(
            !detail.starts_with(&cstr(courier_status_string(COURIER_ERR_TIMEOUT))),
            "{detail}"
        );
        assert_eq!(courier_request_test(req), COURIER_INPROGRESS);
        send(&s, b"late", 4);
        assert_eq!(courier_request_wait_timeout(req, 60_000), COURIER_OK);
        courier_request_free(req);
    }
}
