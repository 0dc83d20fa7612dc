//! What `#[derive(Model)]` costs a build: a crate of 50 models generated
//! twice, once with `#[derive(Serialize, Deserialize, Model)]` and the
//! pattern attributes, once with `#[derive(Serialize, Deserialize)]` alone on
//! the same structs, compared on three measures. No server.
//!
//! The 50 models are ten of each: keyset (a two-field sort), bucket (key and
//! order), rank histogram (board and score), approximate counter (two counters
//! each) and shard key (a coarse field derived from a timestamp, and a search
//! field), one file per pattern (`src/keyset.rs`, ...). Both crates depend on
//! this workspace's `mongo-patterns` (for `ObjectId` and `DateTime`) and
//! `serde`, with this workspace's `Cargo.lock`, and share one target
//! directory, so that their dependencies are built once, before any timing.
//!
//! - **Expanded lines**: `cargo rustc --lib --profile=check --
//!   -Zunpretty=expanded` with `RUSTC_BOOTSTRAP=1` on the pinned toolchain
//!   (what `cargo expand` runs; `cargo expand` is not installed on the
//!   project's machines and nightly is not pinned), formatted by `rustfmt`
//!   (as `cargo expand` formats it, with prettyplease), non-blank lines
//!   counted. Bytes of the unformatted output are given as a second measure.
//!   It has a target directory of its own: cargo builds the dependencies
//!   again when `RUSTC_BOOTSTRAP` changes, which would undo the warm-up of
//!   the timed commands on every run.
//! - **`cargo check`**: wall time of `cargo check` of the generated crate
//!   alone (dependencies checked already) after its `src/lib.rs` is touched,
//!   with `CARGO_INCREMENTAL=0`: the whole crate is checked again.
//! - **Incremental debug build**: wall time of `cargo build` (the default
//!   dev profile, `CARGO_INCREMENTAL=1`) after one field's type in one
//!   model of `src/keyset.rs` is changed (`String` and `Option<String>` in
//!   turn, so that every run is a real edit). rustc expands every derive
//!   of the crate again on every build (macro expansion is not cached);
//!   the rest is reused where the edit left it unchanged.
//!
//! Times are medians of `--runs` runs, the two crates taking turns; wall
//! times of the cargo commands, cargo's own start included.
//!
//! ```text
//! cargo bench --bench derive-cost              # 5 runs of each
//! cargo bench --bench derive-cost -- --runs 9
//! ```
//!
//! Flags (all optional):
//!
//! | flag | default | meaning |
//! | --- | --- | --- |
//! | `--runs N` | 5 | timed runs of each command on each crate |
//! | `--per-pattern N` | 10 | models of each pattern |
//! | `--dir PATH` | `<target>/derive-cost` | where the crates and their target directory go |

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use mongo_patterns_testkit::bench::{median, Flags};

/// The two crates.
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    /// `#[derive(Serialize, Deserialize, Model)]` and the pattern attributes.
    Model,
    /// `#[derive(Serialize, Deserialize)]` alone.
    Serde,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Model => "derive-cost-model",
            Variant::Serde => "derive-cost-serde",
        }
    }
}

/// Writes `text` to `path` unless it holds it already (an unchanged file
/// keeps its mtime, so cargo does not rebuild it).
fn write(path: &Path, text: &str) {
    if fs::read_to_string(path).ok().as_deref() != Some(text) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}

/// A pattern attribute, kept only in the `Model` variant.
fn attr(out: &mut String, v: Variant, line: &str) {
    if v == Variant::Model {
        out.push_str(line);
        out.push('\n');
    }
}

fn header(v: Variant) -> String {
    let mut s = String::from("use mongo_patterns::bson::{oid::ObjectId, DateTime};\n");
    if v == Variant::Model {
        s.push_str("use mongo_patterns::Model;\n");
    }
    s.push_str("use serde::{Deserialize, Serialize};\n");
    s
}

fn derive(v: Variant) -> &'static str {
    match v {
        Variant::Model => "#[derive(Serialize, Deserialize, Model)]\n",
        Variant::Serde => "#[derive(Serialize, Deserialize)]\n",
    }
}

/// The source of each module: (file stem, text). `edit` picks the type of
/// the edited field (the last keyset model's `path`).
fn modules(v: Variant, n: usize, edit: bool) -> Vec<(&'static str, String)> {
    let mut keyset = header(v);
    for i in 0..n {
        let path_type = if i + 1 == n && edit {
            "Option<String>"
        } else {
            "String"
        };
        keyset.push('\n');
        keyset.push_str(derive(v));
        keyset.push_str("#[serde(rename_all = \"camelCase\")]\n");
        attr(
            &mut keyset,
            v,
            "#[keyset(sort = [\"createdAt\", \"score\"], order = \"desc\", page_size = 50)]",
        );
        write!(
            keyset,
            "pub struct Visit{i} {{\n    #[serde(rename = \"_id\")]\n    pub id: ObjectId,\n    \
             pub user_id: String,\n    pub created_at: DateTime,\n    pub score: i64,\n    \
             pub path: {path_type},\n}}\n"
        )
        .unwrap();
    }

    let mut bucket = header(v);
    for i in 0..n {
        bucket.push('\n');
        bucket.push_str(derive(v));
        bucket.push_str("#[serde(rename_all = \"camelCase\")]\n");
        attr(
            &mut bucket,
            v,
            "#[bucket(size = 1000, key = \"customerId\", order = \"date\")]",
        );
        write!(
            bucket,
            "pub struct Trade{i} {{\n    pub customer_id: i64,\n    pub ticker: String,\n    \
             pub qty: i32,\n    pub price: f64,\n    pub date: DateTime,\n}}\n"
        )
        .unwrap();
    }

    let mut rank = header(v);
    for i in 0..n {
        rank.push('\n');
        rank.push_str(derive(v));
        rank.push_str("#[serde(rename_all = \"camelCase\")]\n");
        attr(
            &mut rank,
            v,
            "#[rank_histogram(board = \"examId\", score = \"score\")]",
        );
        write!(
            rank,
            "pub struct ExamResult{i} {{\n    #[serde(rename = \"_id\")]\n    pub id: ObjectId,\n    \
             pub exam_id: String,\n    pub student: String,\n    pub score: f64,\n}}\n"
        )
        .unwrap();
    }

    let mut counter = header(v);
    for i in 0..n {
        counter.push('\n');
        counter.push_str(derive(v));
        counter.push_str("#[serde(rename_all = \"camelCase\")]\n");
        write!(
            counter,
            "pub struct Product{i} {{\n    #[serde(rename = \"_id\")]\n    pub id: String,\n    \
             pub name: String,\n"
        )
        .unwrap();
        attr(&mut counter, v, "    #[approx_counter(every = 100)]");
        counter.push_str("    pub page_views: i64,\n");
        attr(
            &mut counter,
            v,
            "    #[approx_counter(every = 10, mode = \"buffered\", max_delay_ms = 250)]",
        );
        counter.push_str("    pub likes: i64,\n}\n");
    }

    let mut shard = header(v);
    for i in 0..n {
        shard.push('\n');
        shard.push_str(derive(v));
        attr(
            &mut shard,
            v,
            "#[shard_key(coarse = \"month\", from = \"ts\", search = \"type\")]",
        );
        write!(
            shard,
            "pub struct Log{i} {{\n    #[serde(rename = \"_id\")]\n    pub id: ObjectId,\n    \
             pub uuid: String,\n    #[serde(rename = \"type\")]\n    pub kind: String,\n    \
             pub level: String,\n    pub ts: i64,\n    pub msg: String,\n}}\n"
        )
        .unwrap();
    }

    vec![
        ("keyset", keyset),
        ("bucket", bucket),
        ("rank", rank),
        ("counter", counter),
        ("shard", shard),
    ]
}

/// Writes crate `v` under `dir`; returns its directory.
fn generate(dir: &Path, v: Variant, n: usize, runtime: &Path, lock: &Path) -> PathBuf {
    let root = dir.join(v.name());
    let manifest = format!(
        "# Generated by `cargo bench --bench derive-cost`; rewritten on every run.\n\
         [package]\nname = \"{}\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
         [dependencies]\nmongo-patterns = {{ path = {:?} }}\n\
         serde = {{ version = \"1.0.200\", features = [\"derive\"] }}\n\n\
         # Not a member of the mongo-patterns workspace it sits in.\n[workspace]\n",
        v.name(),
        runtime.display().to_string(),
    );
    write(&root.join("Cargo.toml"), &manifest);
    if !root.join("Cargo.lock").exists() {
        fs::copy(lock, root.join("Cargo.lock")).unwrap();
    }
    let mods = modules(v, n, false);
    let mut lib = format!("//! Generated: {} models, {n} of each pattern.\n\n", 5 * n);
    for (m, text) in &mods {
        writeln!(lib, "pub mod {m};").unwrap();
        write(&root.join("src").join(format!("{m}.rs")), text);
    }
    write(&root.join("src/lib.rs"), &lib);
    root
}

/// Sets `path`'s mtime to now, so that cargo compiles its crate again.
fn touch(path: &Path) {
    fs::File::options()
        .append(true)
        .open(path)
        .and_then(|f| f.set_modified(SystemTime::now()))
        .unwrap_or_else(|e| panic!("touching {}: {e}", path.display()));
}

/// A cargo command in `root` with the shared target directory, without the
/// variables `cargo bench` set for this program that would change the
/// child's builds.
fn cargo(root: &Path, target: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(root)
        .arg(args[0])
        .arg("--target-dir")
        .arg(target)
        .args(&args[1..])
        .env_remove("RUSTC_BOOTSTRAP")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_INCREMENTAL");
    c
}

/// Runs `c`; its output, or the end of the program on failure.
fn run(mut c: Command, what: &str) -> Vec<u8> {
    let out = c
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    if !out.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        panic!("{what} failed ({})", out.status);
    }
    out.stdout
}

/// Runs `c` and returns how long it took.
fn timed(c: Command, what: &str) -> Duration {
    let start = Instant::now();
    run(c, what);
    start.elapsed()
}

/// `cargo check` of the whole crate, not incremental, after `src/lib.rs` is
/// touched.
fn check(root: &Path, target: &Path) -> Duration {
    touch(&root.join("src/lib.rs"));
    let mut c = cargo(root, target, &["check", "--lib", "--quiet"]);
    c.env("CARGO_INCREMENTAL", "0");
    timed(c, "cargo check")
}

/// Incremental `cargo build` after one field's type is changed.
fn build(root: &Path, target: &Path, v: Variant, n: usize, edit: bool) -> Duration {
    let (_, keyset) = modules(v, n, edit).swap_remove(0);
    fs::write(root.join("src/keyset.rs"), keyset).unwrap();
    let mut c = cargo(root, target, &["build", "--lib", "--quiet"]);
    c.env("CARGO_INCREMENTAL", "1");
    timed(c, "cargo build")
}

/// The crate's expansion: (non-blank lines after rustfmt, bytes before).
fn expanded(root: &Path, target: &Path, v: Variant) -> (usize, usize) {
    touch(&root.join("src/lib.rs"));
    let mut c = cargo(
        root,
        target,
        &[
            "rustc",
            "--lib",
            "--profile=check",
            "--quiet",
            "--",
            "-Zunpretty=expanded",
        ],
    );
    c.env("RUSTC_BOOTSTRAP", "1").env("CARGO_INCREMENTAL", "0");
    let raw = run(c, "cargo rustc -Zunpretty=expanded");
    assert!(!raw.is_empty(), "no expansion printed for {}", v.name());
    let file = target.join(format!("{}.expanded.rs", v.name()));
    fs::write(&file, &raw).unwrap();
    let rustfmt = std::env::var_os("RUSTFMT").unwrap_or_else(|| "rustfmt".into());
    let mut c = Command::new(rustfmt);
    c.current_dir(root)
        .args(["--edition", "2021", "--emit", "stdout"])
        .arg(&file);
    let formatted = run(c, "rustfmt of the expansion");
    let lines = String::from_utf8_lossy(&formatted)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count();
    (lines, raw.len())
}

fn version(cmd: &str) -> String {
    Command::new(cmd)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn list(v: &[Duration]) -> String {
    v.iter()
        .map(|d| format!("{:.2}", d.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn main() {
    let mut flags = Flags::from_env("derive-cost", "[--runs N] [--per-pattern N] [--dir PATH]");
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let (mut runs, mut n, mut dir) = (5usize, 10usize, None::<PathBuf>);
    while let Some(flag) = flags.next_flag() {
        match flag.as_str() {
            "--runs" => runs = flags.value(&flag),
            "--per-pattern" => n = flags.value(&flag),
            "--dir" => dir = Some(flags.string(&flag).into()),
            _ => flags.unknown(&flag),
        }
    }
    if runs == 0 || n == 0 {
        flags.fail("--runs and --per-pattern must be positive");
    }
    let dir = dir.unwrap_or_else(|| {
        std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace.join("target"))
            .join("derive-cost")
    });
    let started = Instant::now();
    let target = dir.join("target");
    let (runtime, lock) = (workspace.join("runtime"), workspace.join("Cargo.lock"));
    let variants = [Variant::Model, Variant::Serde];
    let roots: Vec<PathBuf> = variants
        .iter()
        .map(|&v| generate(&dir, v, n, &runtime, &lock))
        .collect();

    // Dependencies, checked and built once (the first run takes minutes).
    eprintln!(
        "building the dependencies of both crates in {}",
        dir.display()
    );
    for root in &roots {
        let mut c = cargo(root, &target, &["check", "--lib", "--quiet"]);
        c.env("CARGO_INCREMENTAL", "0");
        run(c, "cargo check (warm-up)");
        let mut c = cargo(root, &target, &["build", "--lib", "--quiet"]);
        c.env("CARGO_INCREMENTAL", "1");
        run(c, "cargo build (warm-up)");
    }
    // One untimed run of each measure, so that the first timed one finds
    // what the others do (the incremental cache of the other field type).
    for (&v, root) in variants.iter().zip(&roots) {
        check(root, &target);
        build(root, &target, v, n, true);
    }

    let mut checks = [Vec::new(), Vec::new()];
    let mut builds = [Vec::new(), Vec::new()];
    for r in 0..runs {
        eprintln!("run {} of {runs}", r + 1);
        for (i, (&v, root)) in variants.iter().zip(&roots).enumerate() {
            checks[i].push(check(root, &target));
            builds[i].push(build(root, &target, v, n, r % 2 == 0));
        }
    }
    // Each crate ends as it was generated.
    for &v in &variants {
        generate(&dir, v, n, &runtime, &lock);
    }

    let exp: Vec<(usize, usize)> = variants
        .iter()
        .zip(&roots)
        .map(|(&v, root)| expanded(root, &dir.join("target-expand"), v))
        .collect();

    let check_med: Vec<Duration> = checks.iter().map(|v| median(&mut v.clone())).collect();
    let build_med: Vec<Duration> = builds.iter().map(|v| median(&mut v.clone())).collect();
    let ratio = |a: f64, b: f64| a / b;

    println!("## What `#[derive(Model)]` costs a build\n");
    println!(
        "- crates: {} models ({n} each of keyset, bucket, rank histogram, approximate \
         counter with two counters, shard key), one file per pattern; `Model` has \
         `#[derive(Serialize, Deserialize, Model)]` and the pattern attributes, `serde` the \
         same structs with `#[derive(Serialize, Deserialize)]` alone",
        5 * n
    );
    println!("- toolchain: {}; {}", version("rustc"), version("cargo"));
    println!(
        "- expanded lines: `RUSTC_BOOTSTRAP=1 cargo rustc --lib --profile=check -- \
         -Zunpretty=expanded` (what `cargo expand` runs), formatted by rustfmt, non-blank \
         lines"
    );
    println!(
        "- `cargo check`: the crate alone after `touch src/lib.rs`, `CARGO_INCREMENTAL=0`; \
         incremental build: `cargo build` (dev profile) after one field's type in \
         `src/keyset.rs` changed; wall times, median of {runs} runs each\n"
    );
    println!("| measure | `Model` | serde only | ratio |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| expanded lines | {} | {} | {:.2}× |",
        exp[0].0,
        exp[1].0,
        ratio(exp[0].0 as f64, exp[1].0 as f64)
    );
    println!(
        "| expanded bytes (unformatted) | {} | {} | {:.2}× |",
        exp[0].1,
        exp[1].1,
        ratio(exp[0].1 as f64, exp[1].1 as f64)
    );
    println!(
        "| `cargo check` | {} | {} | {:.2}× |",
        secs(check_med[0]),
        secs(check_med[1]),
        ratio(check_med[0].as_secs_f64(), check_med[1].as_secs_f64())
    );
    println!(
        "| incremental debug build | {} | {} | {:.2}× |",
        secs(build_med[0]),
        secs(build_med[1]),
        ratio(build_med[0].as_secs_f64(), build_med[1].as_secs_f64())
    );
    println!("\nEvery run, in seconds:\n");
    println!("| measure | `Model` | serde only |");
    println!("| --- | --- | --- |");
    println!(
        "| `cargo check` | {} | {} |",
        list(&checks[0]),
        list(&checks[1])
    );
    println!(
        "| incremental debug build | {} | {} |",
        list(&builds[0]),
        list(&builds[1])
    );
    eprintln!("done in {:.0?}", started.elapsed());
}
