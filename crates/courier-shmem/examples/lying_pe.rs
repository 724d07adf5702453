//! A PE that lies about its symmetric heap, for the error cases of `tests/run.sh`: it
//! publishes a heap twice as long as the region its key covers. A PE that believed it would
//! store past the mapping of that heap; `shmem_init` must end the job instead, naming both
//! ranges.
//!
//! Started as every rank of a job (`oshrun -np 2 lying_pe PROGRAM ARGS...`): rank 0 becomes
//! PROGRAM, an ordinary OpenSHMEM program, and the other ranks join the job as
//! `shmem_init` does (the same keys, in the same order), with the lie in their record.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use courier::{
    Context, ContextParams, Job, JobWorld, MemMapParams, ThreadMode, Worker, WorkerParams,
};
use courier_shmem::CPU_SET_BYTES as SET_BYTES;

const TIMEOUT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(program) = args.first() else {
        eprintln!("usage: lying_pe PROGRAM [ARGS...] (as every rank of a job)");
        return ExitCode::from(2);
    };
    if std::env::var("COURIER_RUN_RANK").as_deref() == Ok("0") {
        let e = Command::new(program).args(&args[1..]).exec();
        eprintln!("lying_pe: starting {program}: {e}");
        return ExitCode::from(127);
    }
    match lie() {
        Ok(()) => {
            eprintln!("lying_pe: rank 0 went on for {TIMEOUT:?} with the lie");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("lying_pe: {e}");
            ExitCode::from(1)
        }
    }
}

/// Join the job as `shmem_init` does, then serve the worker until rank 0 ends the job.
fn lie() -> courier::Result<()> {
    let job = Job::init()?;
    let ctx = Context::new(
        ContextParams::default()
            .features(courier_shmem::PE_FEATURES)
            .name("lying-pe"),
    )?;
    let heap = ctx.mem_map(MemMapParams::allocate(1 << 20))?;
    let worker = Worker::new(
        &ctx,
        WorkerParams {
            thread_mode: ThreadMode::Multi,
        },
    )?;
    let world = JobWorld::with_name(&job, &worker, "shmem", TIMEOUT)?;
    // The segment record (courier-shmem's `record::emit`): host; then per segment base,
    // length, key length and key; no data segment.
    let key = heap.pack_rkey()?;
    let mut seg = courier::host_id().to_vec();
    seg.extend_from_slice(&(heap.as_ptr() as u64).to_le_bytes());
    seg.extend_from_slice(&(2 * heap.len() as u64).to_le_bytes());
    seg.extend_from_slice(&(key.len() as u32).to_le_bytes());
    seg.extend_from_slice(&key);
    seg.extend_from_slice(&[0; 20]);
    job.put("shmem-seg", &seg)?;
    let mut cpus = courier::machine_id().to_vec();
    cpus.extend_from_slice(&[0xff; SET_BYTES]);
    job.put("shmem-cpus", &cpus)?;
    job.fence(TIMEOUT)?;
    world.connect_all()?;
    world.barrier(TIMEOUT)?;
    let end = Instant::now() + TIMEOUT;
    while Instant::now() < end {
        worker.progress();
        worker.wait(Some(Duration::from_millis(10)))?;
    }
    Ok(())
}
