#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| courier_fuzz::shmem_exchange(data));
