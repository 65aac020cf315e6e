//! Runs the decoders of peer input on many generated inputs and counts
//! crashes (see `slowmo_gossip::p2p::fuzz`):
//!
//! ```text
//! cargo run --release -p slowmo-gossip --example fuzz_decoders -- --execs 10000000
//! cargo run --release -p slowmo-gossip --example fuzz_decoders -- --target chunk --execs 1000 --seed 7
//! cargo run --release -p slowmo-gossip --example fuzz_decoders -- --target share --replay crash.bin
//! cargo run --release -p slowmo-gossip --example fuzz_decoders -- --corpus gossip/fuzz/corpus --execs 200
//! ```
//!
//! Options: `--execs N` inputs per target (default 100000), `--seed S`
//! (default 1), `--target NAME` (repeatable; default every target),
//! `--threads T` (default 1; each thread its own seed), `--replay FILE` (run
//! one saved input and print what the target made of it), `--corpus DIR`
//! (write `--execs` generated inputs per target into `DIR/TARGET/`, seeds
//! for `cargo fuzz`). A crashing input is saved under `fuzz-crashes/` and the
//! exit status is 1.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Instant;

use slowmo_gossip::p2p::fuzz::{self, Rng, TARGETS};

#[derive(Default)]
struct Tally {
    execs: u64,
    accepted: u64,
    refused: u64,
    valid: u64,
    crashes: u64,
    first_crash: Option<(Vec<u8>, String)>,
}

fn tally(target: &str, seed: u64, execs: u64) -> Tally {
    let mut rng = Rng::new(seed);
    let mut t = Tally::default();
    for _ in 0..execs {
        let case = fuzz::generate(target, &mut rng);
        t.execs += 1;
        match catch_unwind(AssertUnwindSafe(|| fuzz::run(target, &case.bytes))) {
            Ok(out) => {
                if out.error.is_some() {
                    t.refused += 1;
                } else {
                    t.accepted += 1;
                }
                if let Some(n) = case.valid {
                    t.valid += 1;
                    if out.error.is_some() || out.accepted != n {
                        t.crashes += 1;
                        let why = format!("a valid input was not taken whole: {out:?}");
                        t.first_crash.get_or_insert((case.bytes.clone(), why));
                    }
                }
            }
            Err(panic) => {
                t.crashes += 1;
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into());
                t.first_crash.get_or_insert((case.bytes.clone(), why));
            }
        }
    }
    t
}

fn main() -> ExitCode {
    let mut execs: u64 = 100_000;
    let mut seed: u64 = 1;
    let mut threads: u64 = 1;
    let mut targets: Vec<String> = Vec::new();
    let mut replay = None;
    let mut corpus: Option<std::path::PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{name} needs a value"))
        };
        match a.as_str() {
            "--execs" => execs = value("--execs").parse().expect("--execs: a number"),
            "--seed" => seed = value("--seed").parse().expect("--seed: a number"),
            "--threads" => threads = value("--threads").parse().expect("--threads: a number"),
            "--target" => targets.push(value("--target")),
            "--replay" => replay = Some(value("--replay")),
            "--corpus" => corpus = Some(value("--corpus").into()),
            other => {
                eprintln!("unknown argument `{other}`; see the example's doc comment");
                return ExitCode::FAILURE;
            }
        }
    }
    if targets.is_empty() {
        targets = TARGETS.iter().map(|t| t.to_string()).collect();
    }
    if let Some(path) = replay {
        let data = std::fs::read(&path).expect("reading the input to replay");
        for t in &targets {
            println!("{t}: {:?}", fuzz::run(t, &data));
        }
        return ExitCode::SUCCESS;
    }
    if let Some(dir) = corpus {
        for t in &targets {
            let dir = dir.join(t);
            std::fs::create_dir_all(&dir).expect("creating the corpus folder");
            let mut rng = Rng::new(seed);
            for i in 0..execs {
                let case = fuzz::generate(t, &mut rng);
                std::fs::write(dir.join(format!("seed-{i}")), &case.bytes)
                    .expect("writing a corpus input");
            }
            println!("{execs} inputs in {}", dir.display());
        }
        return ExitCode::SUCCESS;
    }
    // Panics are counted, not printed one by one.
    std::panic::set_hook(Box::new(|_| {}));
    let threads = threads.max(1);
    let mut crashed = false;
    println!(
        "{:<8} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8} {:>10}",
        "target", "executions", "taken", "refused", "valid", "crashes", "seconds", "execs/s"
    );
    for target in &targets {
        let started = Instant::now();
        let total = Mutex::new(Tally::default());
        std::thread::scope(|s| {
            for i in 0..threads {
                let share = execs / threads + u64::from(i < execs % threads);
                let total = &total;
                let target = target.as_str();
                s.spawn(move || {
                    let t = tally(target, seed.wrapping_add(i.wrapping_mul(1_000_003)), share);
                    let mut all = total.lock().unwrap_or_else(|e| e.into_inner());
                    all.execs += t.execs;
                    all.accepted += t.accepted;
                    all.refused += t.refused;
                    all.valid += t.valid;
                    all.crashes += t.crashes;
                    if all.first_crash.is_none() {
                        all.first_crash = t.first_crash;
                    }
                });
            }
        });
        let t = total.into_inner().unwrap_or_else(|e| e.into_inner());
        let secs = started.elapsed().as_secs_f64();
        println!(
            "{:<8} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8.1} {:>10.0}",
            target,
            t.execs,
            t.accepted,
            t.refused,
            t.valid,
            t.crashes,
            secs,
            t.execs as f64 / secs.max(1e-9)
        );
        if let Some((bytes, why)) = t.first_crash {
            crashed = true;
            let dir = std::path::Path::new("fuzz-crashes");
            let _ = std::fs::create_dir_all(dir);
            let path = dir.join(format!("{target}-seed{seed}.bin"));
            let _ = std::fs::write(&path, &bytes);
            println!("  first crash: {why} (input saved to {})", path.display());
        }
    }
    if crashed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
