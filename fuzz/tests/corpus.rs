//! Every fuzz target over its checked-in corpus (`corpus/<target>/`: the seeds, and what
//! the libFuzzer runs of `make fuzz` kept), over its seeds, and over a few thousand inputs
//! made from them by flipping, cutting and splicing bytes. Seconds, in `make test`; the
//! long coverage-guided runs are `make fuzz`'s.

use std::path::PathBuf;

use courier_fuzz::{TARGETS, seeds};

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = corpus_dir(target);
    let rd = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{target}: no corpus at {}: {e}", dir.display()));
    let mut v: Vec<(PathBuf, Vec<u8>)> = rd
        .map(|e| {
            let p = e.expect("a corpus entry").path();
            let b = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, b)
        })
        .collect();
    v.sort();
    v
}

#[test]
fn every_target_replays_its_corpus() {
    for (name, run) in TARGETS {
        let files = corpus(name);
        assert!(!files.is_empty(), "{name}: the corpus is empty");
        for (path, bytes) in &files {
            eprintln!("{name}: {}", path.display());
            run(bytes);
        }
        eprintln!("{name}: {} corpus inputs", files.len());
    }
}

#[test]
fn every_seed_is_in_the_corpus() {
    for (name, run) in TARGETS {
        let files = corpus(name);
        let s = seeds(name);
        assert!(!s.is_empty(), "{name}: no seeds");
        for seed in s {
            run(&seed);
            assert!(
                files.iter().any(|(_, b)| *b == seed),
                "{name}: a seed is missing from corpus/{name} (run make fuzz-seeds)"
            );
        }
    }
}

/// A small xorshift: the same inputs on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn every_target_survives_mutated_inputs() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for (name, run) in TARGETS {
        let base: Vec<Vec<u8>> = corpus(name).into_iter().map(|(_, b)| b).collect();
        for _ in 0..3000 {
            let mut v = base[rng.below(base.len())].clone();
            match rng.below(5) {
                0 if !v.is_empty() => {
                    let i = rng.below(v.len());
                    v[i] ^= 1 << rng.below(8);
                }
                1 if !v.is_empty() => {
                    for _ in 0..1 + rng.below(8) {
                        let i = rng.below(v.len());
                        v[i] = rng.next() as u8;
                    }
                }
                2 => v.truncate(rng.below(v.len() + 1)),
                3 => {
                    let other = &base[rng.below(base.len())];
                    let at = rng.below(other.len() + 1);
                    v.extend_from_slice(&other[at..]);
                }
                _ => {
                    let n = rng.below(300);
                    v = (0..n).map(|_| rng.next() as u8).collect();
                }
            }
            run(&v);
        }
    }
}

/// Writes each target's seeds into its corpus (`make fuzz-seeds`); not a check.
#[test]
#[ignore]
fn write_seeds() {
    for (name, _) in TARGETS {
        let dir = corpus_dir(name);
        std::fs::create_dir_all(&dir).expect("corpus dir");
        for (i, seed) in seeds(name).iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), seed).expect("write seed");
        }
    }
}

/// The seeds are messages the parsers accept (so the targets start from the inside of
/// each format, not from its first refusal).
#[test]
fn seeds_are_well_formed() {
    use courier::wire::{address::WorkerAddress, auth::AuthMsg, frame::Frame, rkey::RkeyRepr};
    for s in seeds("frame") {
        assert!(Frame::parse(&s).is_ok(), "{:?}", Frame::parse(&s));
    }
    for s in seeds("rndv_segments") {
        assert!(s.len() > 13);
    }
    assert!(WorkerAddress::unpack(&seeds("worker_address")[0]).is_ok());
    assert!(RkeyRepr::unpack(&seeds("remote_key")[0]).is_ok());
    for s in seeds("auth_handshake") {
        assert!(AuthMsg::parse(&s).is_ok());
    }
    let tcp = &seeds("tcp_framing")[0];
    let frames = courier::fuzzing::fuzz_framing(tcp, courier::fuzzing::MAX_FRAME).unwrap();
    assert_eq!(frames.len(), 6);
    let fifo = seeds("shm_fifo");
    assert_eq!(courier::fuzzing::fuzz_consumer(&fifo[0]), 3);
    assert_eq!(courier::fuzzing::fuzz_consumer(&fifo[1]), 2);
    for s in seeds("perf_control") {
        assert!(courier_cli::perf_params::Params::decode(&s).is_ok());
    }
    for s in seeds("exs_message") {
        assert!(courier::wire::exs::decode(&s).is_ok());
    }
    use courier::job::{runwire, text};
    let run = seeds("run_control");
    assert!(runwire::parse_hello(&run[0][..].try_into().unwrap()).is_some());
    for s in &run[1..] {
        let ok = if s[0] == 0 {
            runwire::Request::decode(&s[1..]).is_ok()
        } else {
            runwire::Reply::decode(&s[1..]).is_ok()
        };
        assert!(ok, "{s:?}");
    }
    let pmi: Vec<String> = seeds("pmi_text")
        .iter()
        .map(|s| String::from_utf8(s[2..].to_vec()).unwrap())
        .collect();
    assert!(text::pairs(&pmi[0], ' ').is_ok() && text::pairs(&pmi[2], ';').is_ok());
    assert!(text::head(&pmi[3]).is_ok() && text::decode(&pmi[4]).is_ok());
    assert!(text::process_mapping(&pmi[5], 4).is_ok());
    use courier_fuzz::shmem_record::{SET_BYTES, parse, shared};
    let sh = seeds("shmem_exchange");
    assert!(parse(&sh[0]).is_ok() && parse(&sh[1]).is_ok());
    let all: Vec<Vec<u8>> = sh[2][1..]
        .chunks(16 + SET_BYTES)
        .map(<[u8]>::to_vec)
        .collect();
    assert_eq!(shared(1, &all), Ok((2, 2)));
}
