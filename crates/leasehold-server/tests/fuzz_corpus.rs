//! Every fuzz target (`leasehold_server::fuzzing`) over its committed corpus
//! (`fuzz/corpus/TARGET/`), then over mutations of it for a bounded time:
//! bytes flipped, cut, repeated, spliced from two inputs, lengths set to
//! extremes. A decoder may refuse any input; a panic fails the test and
//! writes the input under `target/fuzz-failures/` to replay. The
//! coverage-guided run, for as long as you like, is `scripts/fuzz TARGET`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use leasehold_server::fuzzing::TARGETS;

/// How long each target's mutations run (the corpus itself always runs
/// whole). `LEASEHOLD_FUZZ_SECS` sets another.
fn budget() -> Duration {
    let secs = std::env::var("LEASEHOLD_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = repo().join("fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| std::fs::read(f).unwrap_or_else(|e| panic!("read {}: {e}", f.display())))
        .collect()
}

/// A small seeded generator (xorshift64*): the same mutations every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// One mutation of `input`, sometimes spliced with `other`.
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(4) {
        match rng.below(7) {
            0 if !out.is_empty() => {
                let at = rng.below(out.len());
                out[at] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let at = rng.below(out.len());
                out[at] = rng.next() as u8;
            }
            2 => out.truncate(rng.below(out.len() + 1)),
            3 if !out.is_empty() => {
                // A length-like field set to an extreme.
                let at = rng.below(out.len());
                let extreme = [0u8, 0xff, 0x7f, 0x80][rng.below(4)];
                for b in out.iter_mut().skip(at).take(4) {
                    *b = extreme;
                }
            }
            4 if !out.is_empty() => {
                let from = rng.below(out.len());
                let to = (from + rng.below(64)).min(out.len());
                let piece = out[from..to].to_vec();
                let at = rng.below(out.len() + 1);
                out.splice(at..at, piece);
            }
            5 if !other.is_empty() => {
                let cut = rng.below(out.len() + 1);
                let from = rng.below(other.len());
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            _ => out.push(rng.next() as u8),
        }
    }
    out
}

/// Runs `target` on `input`; on a panic, keeps the input and fails.
fn run(name: &str, target: fn(&[u8]), input: &[u8]) {
    if catch_unwind(AssertUnwindSafe(|| target(input))).is_err() {
        let dir = repo().join("target/fuzz-failures").join(name);
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("{:016x}", fnv(input)));
        let _ = std::fs::write(&path, input);
        panic!(
            "fuzz target {name} panicked on {} bytes, kept in {}: replay it with scripts/fuzz {name} {}",
            input.len(),
            path.display(),
            path.display()
        );
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[test]
fn every_decoder_survives_its_corpus_and_mutations_of_it() {
    let budget = budget();
    for (i, (name, target)) in TARGETS.iter().enumerate() {
        let inputs = corpus(name);
        assert!(!inputs.is_empty(), "fuzz/corpus/{name} holds no input");
        for input in &inputs {
            run(name, *target, input);
        }
        run(name, *target, &[]);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1));
        let started = Instant::now();
        let mut runs = 0u64;
        while started.elapsed() < budget {
            let input = &inputs[rng.below(inputs.len())];
            let other = &inputs[rng.below(inputs.len())];
            run(name, *target, &mutate(&mut rng, input, other));
            runs += 1;
        }
        eprintln!("{name}: {} corpus inputs, {runs} mutations", inputs.len());
    }
}
