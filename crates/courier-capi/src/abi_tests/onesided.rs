//! One-sided operations and signal waits through the C ABI, on a local region.

use super::*;

#[test]
fn one_sided_on_a_local_region() {
    let s = Setup::new();
    // SAFETY: the buffers outlive the request, which is waited for before they go.
    unsafe {
        // CUDA memory without a driver or device is an error, never a panic.
        let mut mp = courier_mem_map_params_t {
            field_mask: COURIER_MEM_MAP_FIELD_LENGTH
                | COURIER_MEM_MAP_FIELD_FLAGS
                | COURIER_MEM_MAP_FIELD_MEMORY_TYPE,
            address: null_mut(),
            length: 4096,
            flags: COURIER_MEM_MAP_FLAG_ALLOCATE,
            memory_type: COURIER_MEMORY_TYPE_CUDA,
            access: 0,
        };
        let mut mem = null_mut();
        let rc = courier_mem_map(s.ctx, &mp, &mut mem);
        if rc == COURIER_OK {
            // A machine with a GPU: device memory, said so.
            let mut attr = std::mem::zeroed::<courier_mem_attr_t>();
            assert_eq!(courier_mem_query(mem, &mut attr), COURIER_OK);
            assert_eq!(attr.memory_type, COURIER_MEMORY_TYPE_CUDA);
            courier_mem_unmap(mem);
            mem = null_mut();
        } else {
            assert!(rc < 0);
            assert!(mem.is_null());
        }
        mp.memory_type = 99;
        assert_eq!(
            courier_mem_map(s.ctx, &mp, &mut mem),
            COURIER_ERR_INVALID_PARAM
        );
        mp.memory_type = COURIER_MEMORY_TYPE_HOST;
        assert_eq!(courier_mem_map(s.ctx, &mp, &mut mem), COURIER_OK);
        let mut attr = std::mem::zeroed::<courier_mem_attr_t>();
        assert_eq!(courier_mem_query(mem, &mut attr), COURIER_OK);
        assert_eq!(attr.length, 4096);
        assert_eq!(attr.memory_type, COURIER_MEMORY_TYPE_HOST);
        let base = attr.address as u64;

        let (mut kb, mut kl) = (null_mut(), 0usize);
        assert_eq!(courier_rkey_pack(mem, &mut kb, &mut kl), COURIER_OK);
        let mut rk = null_mut();
        assert_eq!(
            courier_ep_rkey_unpack(s.ep, c"junk".as_ptr().cast(), 4, &mut rk),
            COURIER_ERR_INVALID_KEY
        );
        assert_eq!(courier_ep_rkey_unpack(s.ep, kb, kl, &mut rk), COURIER_OK);
        courier_buffer_free(kb);
        assert_eq!(cstr(courier_rkey_path(rk)), "local");
        let (mut b, mut l) = (0u64, 0u64);
        assert_eq!(courier_rkey_bounds(rk, &mut b, &mut l), COURIER_OK);
        assert_eq!((b, l), (base, 4096));

        let data = [5u8; 100];
        let mut info = courier_request_info_t::default();
        let mut req = null_mut();
        let st = courier_ep_put(
            s.ep,
            data.as_ptr().cast(),
            100,
            base + 8,
            rk,
            null(),
            &mut req,
        );
        assert_eq!(settle(st, req, &mut info), COURIER_OK);
        let mut back = [0u8; 100];
        let st = courier_ep_get(
            s.ep,
            back.as_mut_ptr().cast(),
            100,
            base + 8,
            rk,
            null(),
            &mut req,
        );
        assert_eq!(settle(st, req, &mut info), COURIER_OK);
        assert_eq!(back, data);
        let st = courier_ep_put(
            s.ep,
            data.as_ptr().cast(),
            100,
            base + 4090,
            rk,
            null(),
            &mut req,
        );
        assert_eq!(settle(st, req, &mut info), COURIER_ERR_OUT_OF_RANGE);

        let op = courier_op_params_t {
            field_mask: COURIER_OP_FIELD_INFO,
            cb: None,
            user_data: null_mut(),
            info: &mut info,
        };
        for (v, old) in [(3u64, 0u64), (4, 3)] {
            let st = courier_ep_atomic(
                s.ep,
                COURIER_ATOMIC_OP_ADD,
                v,
                0,
                8,
                base + 1024,
                rk,
                &op,
                &mut req,
            );
            assert_eq!(settle(st, req, &mut info), COURIER_OK);
            assert_eq!(info.value, old);
        }
        assert_eq!(
            courier_ep_atomic(s.ep, 77, 1, 0, 8, base + 1024, rk, &op, &mut req),
            COURIER_ERR_INVALID_PARAM
        );
        // Posted atomics: done at once on a region mapped here; the fetch sees them.
        for (o, v) in [
            (COURIER_ATOMIC_OP_ADD, 10u64),
            (COURIER_ATOMIC_OP_OR, 0x100),
        ] {
            assert_eq!(
                courier_ep_atomic_post(s.ep, o, v, 8, base + 1024, rk),
                COURIER_OK
            );
        }
        for (o, size, addr) in [
            (COURIER_ATOMIC_OP_SWAP, 8, base + 1024),
            (COURIER_ATOMIC_OP_CSWAP, 4, base + 1024),
            (77, 8, base + 1024),
            (COURIER_ATOMIC_OP_ADD, 2, base + 1024),
            (COURIER_ATOMIC_OP_ADD, 8, base + 1028),
        ] {
            assert_eq!(
                courier_ep_atomic_post(s.ep, o, 1, size, addr, rk),
                COURIER_ERR_INVALID_PARAM,
                "op {o} size {size} at +{}",
                addr - base
            );
        }
        assert_eq!(
            courier_ep_atomic_post(s.ep, COURIER_ATOMIC_OP_ADD, 1, 8, base + 4096, rk),
            COURIER_ERR_OUT_OF_RANGE
        );
        let st = courier_ep_atomic(
            s.ep,
            COURIER_ATOMIC_OP_ADD,
            0,
            0,
            8,
            base + 1024,
            rk,
            &op,
            &mut req,
        );
        assert_eq!(settle(st, req, &mut info), COURIER_OK);
        assert_eq!(info.value, (3 + 4 + 10) | 0x100);
        assert_eq!(courier_ep_flush(s.ep), COURIER_OK);
        assert_eq!(
            courier_ep_atomic(
                s.ep,
                COURIER_ATOMIC_OP_ADD,
                1,
                0,
                2,
                base + 1024,
                rk,
                &op,
                &mut req
            ),
            COURIER_ERR_INVALID_PARAM
        );

        let st = courier_ep_put_signal(
            s.ep,
            data.as_ptr().cast(),
            100,
            base + 2048,
            rk,
            base + 4088,
            rk,
            2,
            COURIER_SIGNAL_ADD,
            null(),
            &mut req,
        );
        assert_eq!(settle(st, req, &mut info), COURIER_OK);
        assert_eq!(courier_ep_fence(s.ep), COURIER_OK);
        let mut sig = 0u64;
        assert_eq!(courier_signal_fetch(mem, 4088, &mut sig), COURIER_OK);
        assert_eq!(sig, 2);
        assert_eq!(
            courier_signal_fetch(mem, 4089, &mut sig),
            COURIER_ERR_OUT_OF_RANGE
        );
        assert_eq!(
            courier_signal_wait_until(mem, s.w, 4088, COURIER_CMP_GE, 2, 0, 1000, &mut sig),
            COURIER_OK
        );
        assert_eq!(
            courier_signal_wait_until(mem, s.w, 4088, COURIER_CMP_GT, 2, 0, 20, &mut sig),
            COURIER_ERR_TIMEOUT
        );
        courier_rkey_destroy(rk);
        courier_mem_unmap(mem);

        let mut sem = null_mut();
        assert_eq!(
            courier_sem_create(
                s.ctx,
                COURIER_SEM_FLAG_BOOLEAN | COURIER_SEM_FLAG_INTEGER,
                &mut sem
            ),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(courier_sem_create(s.ctx, 0, &mut sem), COURIER_OK);
        assert_eq!(courier_sem_try(sem, 1), COURIER_ERR_NO_RESOURCE);
        assert_eq!(courier_sem_post(sem, 3), COURIER_OK);
        assert_eq!(courier_sem_wait(sem, s.w, 2), COURIER_OK);
        let mut v = 0u64;
        assert_eq!(courier_sem_value(sem, &mut v), COURIER_OK);
        assert_eq!(v, 1);
        // Only 1 is there: a limited wait for 2, sleeping or not, times out and takes
        // nothing.
        for flags in [0, COURIER_SIGNAL_WAIT_FLAG_SLEEP] {
            assert_eq!(
                courier_sem_wait_timeout(sem, s.w, 2, flags, 20),
                COURIER_ERR_TIMEOUT
            );
        }
        assert_eq!(
            courier_sem_wait_timeout(sem, s.w, 1, COURIER_SIGNAL_WAIT_FLAG_SLEEP, 1000),
            COURIER_OK
        );
        assert_eq!(courier_sem_post(sem, 1), COURIER_OK);
        assert_eq!(
            courier_sem_post(sem, COURIER_SEM_MAX),
            COURIER_ERR_INVALID_PARAM
        );
        let (mut kb, mut kl, mut addr) = (null_mut(), 0usize, 0u64);
        assert_eq!(
            courier_sem_remote(sem, &mut kb, &mut kl, &mut addr),
            COURIER_OK
        );
        courier_buffer_free(kb);
        courier_sem_destroy(sem);
    }
}

/// With `COURIER_SIGNAL_WAIT_FLAG_SLEEP` on a context without the wakeup feature the wait
/// spins (yielding) instead of failing, as the Rust call does.
#[test]
fn sleeping_signal_wait_without_wakeup_spins() {
    // SAFETY: the buffers outlive the request, which is waited for before they go.
    unsafe {
        let (mut p, _cfg) = tls(c"all");
        p.field_mask |= COURIER_CONTEXT_FIELD_FEATURES;
        p.features = COURIER_FEATURE_TAG | COURIER_FEATURE_RMA | COURIER_FEATURE_AMO;
        let mut ctx = null_mut();
        assert_eq!(courier_context_create(&p, &mut ctx), COURIER_OK);
        let mut w = null_mut();
        assert_eq!(courier_worker_create(ctx, null(), &mut w), COURIER_OK);
        let mp = alloc_params(4096);
        let mut mem = null_mut();
        assert_eq!(courier_mem_map(ctx, &mp, &mut mem), COURIER_OK);
        let mut attr = std::mem::zeroed::<courier_mem_attr_t>();
        assert_eq!(courier_mem_query(mem, &mut attr), COURIER_OK);
        let word = attr.address as usize + 64;
        let setter = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            AtomicU64::from_ptr(word as *mut u64).store(7, Ordering::Release);
        });
        let sleep = COURIER_SIGNAL_WAIT_FLAG_SLEEP;
        let mut v = 0u64;
        assert_eq!(
            courier_signal_wait_until(mem, w, 64, COURIER_CMP_GE, 7, sleep, 10_000, &mut v),
            COURIER_OK
        );
        assert_eq!(v, 7);
        setter.join().unwrap();
        assert_eq!(
            courier_signal_wait_until(mem, w, 64, COURIER_CMP_EQ, 8, sleep, 20, &mut v),
            COURIER_ERR_TIMEOUT
        );
        courier_mem_unmap(mem);
        courier_worker_destroy(w);
        courier_context_destroy(ctx);
    }
}
