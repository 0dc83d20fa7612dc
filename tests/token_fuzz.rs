//! Fuzzes the page-token decoder: over a million generated inputs (random
//! bytes and strings, deep nesting with valid checksums, huge sizes, values
//! of every BSON type, and real tokens mutated by byte flips, truncations
//! and splices, with and without a repaired checksum). No input may panic
//! or abort; a stack overflow would kill this process, so the deep inputs
//! run on a thread with a deliberately small stack. Deterministic (a fixed
//! seed; the real tokens' fingerprints include the run's database name) and
//! time-bounded.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongo_patterns::bson::spec::BinarySubtype;
use mongo_patterns::bson::{self, Binary, Bson, Decimal128, Timestamp};
use mongo_patterns::keyset::{KeysetSpec, MAX_TOKEN_LEN};
use mongo_patterns::prelude::*;
use mongo_patterns::{CursorError, Error};
use mongo_patterns_testkit::forge::{b64_decode, b64_encode, fnv1a64, B64};
use mongo_patterns_testkit::fresh_db;

/// Inputs generated; the test fails if fewer ran.
const INPUTS: u64 = 1_000_000;
/// The test stops itself and fails past this.
const TIME_BOUND: Duration = Duration::from_secs(120);
const SEED: u64 = 0x6b65_7973_6574_2d31;
/// Stack of the fuzzing thread: bounded decoding needs little.
const STACK: usize = 512 * 1024;

/// SplitMix64: small, fixed, good enough to drive a fuzzer.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Token bytes (version 2) around a BSON body, with a valid checksum.
fn frame(flags: u8, fingerprint: u64, body: &[u8], mac: Option<&[u8]>) -> Vec<u8> {
    let mut out = vec![2u8, flags];
    out.extend_from_slice(&fingerprint.to_le_bytes());
    out.extend_from_slice(body);
    if let Some(mac) = mac {
        out.extend_from_slice(mac);
    }
    let sum = fnv1a64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Replaces the last 8 bytes with the checksum of the rest.
fn repair(bytes: &mut [u8]) {
    if bytes.len() >= 8 {
        let n = bytes.len() - 8;
        let sum = fnv1a64(&bytes[..n]);
        bytes[n..].copy_from_slice(&sum.to_le_bytes());
    }
}

/// `{"v": [ {"0": [ {...} ] } ]}`: `depth` containers, documents and arrays
/// mixed, written byte by byte (deeper than bson would build).
fn raw_nest(rng: &mut Rng, depth: usize) -> Vec<u8> {
    let total = 8 * depth + 5;
    let mut out = Vec::with_capacity(total);
    for i in 0..depth {
        out.extend_from_slice(&((total - 8 * i) as i32).to_le_bytes());
        // Documents, with an array now and then.
        let kind = if i == 0 || rng.below(16) == 0 { 4 } else { 3 };
        out.extend_from_slice(&[kind, if i == 0 { b'v' } else { b'0' }, 0]);
    }
    out.extend_from_slice(&5i32.to_le_bytes());
    out.resize(total, 0);
    out
}

fn any_value(rng: &mut Rng, depth: usize) -> Bson {
    let s = |rng: &mut Rng| -> String {
        (0..rng.below(12))
            .map(|_| ["a", "$", "é", "\u{0}", "z", "."][rng.below(6) as usize])
            .collect()
    };
    // Keys and regexes are C strings: no NUL.
    let key = |rng: &mut Rng| -> String { s(rng).replace('\0', "") };
    match rng.below(if depth > 3 { 19 } else { 22 }) {
        0 => Bson::Double(f64::from_bits(rng.next())),
        1 => Bson::Double([f64::NAN, -f64::NAN, f64::INFINITY, -0.0][rng.below(4) as usize]),
        2 => Bson::String(s(rng)),
        3 => Bson::Boolean(rng.below(2) == 0),
        4 => Bson::Null,
        5 => mongo_patterns_testkit::bsonc::regex(&key(rng), "i"),
        6 => Bson::JavaScriptCode(s(rng)),
        7 => Bson::Int32(rng.next() as i32),
        8 => Bson::Int64(rng.next() as i64),
        9 => Bson::Timestamp(Timestamp {
            time: rng.next() as u32,
            increment: rng.next() as u32,
        }),
        10 => Bson::Binary(Binary {
            subtype: [
                BinarySubtype::Generic,
                BinarySubtype::Uuid,
                BinarySubtype::Md5,
                BinarySubtype::UserDefined(0x80),
            ][rng.below(4) as usize],
            bytes: {
                let n = rng.below(20) as usize;
                rng.bytes(n)
            },
        }),
        11 => Bson::ObjectId(ObjectId::from_bytes(rng.bytes(12).try_into().unwrap())),
        12 => Bson::DateTime(DateTime::from_millis(rng.next() as i64)),
        13 => Bson::Symbol(s(rng)),
        14 => Bson::Decimal128(Decimal128::from_bytes(rng.bytes(16).try_into().unwrap())),
        15 => Bson::Undefined,
        16 => Bson::MaxKey,
        17 => Bson::MinKey,
        18 => Bson::Decimal128("NaN".parse().unwrap()),
        19 => {
            let mut d = Document::new();
            for _ in 0..rng.below(4) {
                d.insert(key(rng), any_value(rng, depth + 1));
            }
            Bson::Document(d)
        }
        20 => Bson::Array(
            (0..rng.below(4))
                .map(|_| any_value(rng, depth + 1))
                .collect(),
        ),
        _ => Bson::JavaScriptCodeWithScope(bson::JavaScriptCodeWithScope {
            code: s(rng),
            scope: doc! {"x": any_value(rng, depth + 1)},
        }),
    }
}

/// One generated input, as the string a client would send.
fn generate(rng: &mut Rng, real: &[Vec<u8>], fingerprints: &[u64], huge: &str) -> String {
    match rng.below(100) {
        // Random bytes, base64-encoded (mostly refused by the checksum).
        0..=14 => {
            let n = rng.below(120) as usize;
            b64_encode(&rng.bytes(n))
        }
        // Random strings, some over the length limit, some not base64.
        15..=19 => {
            let n = match rng.below(10) {
                0 => MAX_TOKEN_LEN + rng.below(3) as usize - 1,
                1 => MAX_TOKEN_LEN - 100 + rng.below(200) as usize,
                _ => rng.below(200) as usize,
            };
            (0..n)
                .map(|_| match rng.below(20) {
                    0 => ' ',
                    1 => '=',
                    2 => '+',
                    3 => 'é',
                    _ => B64[rng.below(64) as usize] as char,
                })
                .collect()
        }
        // Huge: 10 MB, shared (its refusal must not depend on its content).
        20 => {
            if rng.below(100) == 0 {
                huge.to_owned()
            } else {
                huge[..MAX_TOKEN_LEN + 1].to_owned()
            }
        }
        // Deep nesting with a valid checksum: 150 and more (up to what fits
        // in a token's length; deeper is refused by length first, and the
        // unit tests feed 100,000 levels straight to the decoder).
        21..=32 => {
            let depth = match rng.below(8) {
                0 => 150 + rng.below(230) as usize,
                _ => rng.below(40) as usize + 1,
            };
            let fp = fingerprints[rng.below(fingerprints.len() as u64) as usize];
            let body = raw_nest(rng, depth);
            let bytes = frame(0, fp, &body, None);
            if bytes.len() * 4 / 3 > MAX_TOKEN_LEN {
                // Past the string limit: refused before decoding anyway, so
                // cut it down to reach the decoder with a broken document.
                let mut cut = bytes[..MAX_TOKEN_LEN * 3 / 4 - 8].to_vec();
                cut.extend_from_slice(&[0; 8]);
                repair(&mut cut);
                b64_encode(&cut)
            } else {
                b64_encode(&bytes)
            }
        }
        // Values of every BSON type (and nested ones) with a valid checksum,
        // under a real fingerprint so they reach the boundary builder.
        33..=44 => {
            let values: Vec<Bson> = (0..rng.below(4) + 1).map(|_| any_value(rng, 0)).collect();
            let fp = fingerprints[rng.below(fingerprints.len() as u64) as usize];
            let body = mongo_patterns_testkit::bsonc::to_vec(&doc! {"v": values}).unwrap();
            let signed = rng.below(4) == 0;
            let mac = rng.bytes(32);
            b64_encode(&frame(
                u8::from(signed),
                fp,
                &body,
                signed.then_some(&mac[..]),
            ))
        }
        // Mutated real tokens: flips, truncations, splices, insertions;
        // half of them with the checksum repaired, so they reach the
        // BSON walker.
        _ => {
            let mut t = real[rng.below(real.len() as u64) as usize].clone();
            for _ in 0..rng.below(4) + 1 {
                match rng.below(6) {
                    0 | 1 => {
                        let i = rng.below(t.len() as u64) as usize;
                        if i < t.len() {
                            t[i] ^= 1 << rng.below(8);
                        }
                    }
                    2 => {
                        let i = rng.below(t.len() as u64) as usize;
                        if i < t.len() {
                            t[i] = rng.next() as u8;
                        }
                    }
                    3 => t.truncate(rng.below(t.len() as u64 + 1) as usize),
                    4 => {
                        let other = &real[rng.below(real.len() as u64) as usize];
                        let a = rng.below(t.len() as u64 + 1) as usize;
                        let b = rng.below(other.len() as u64 + 1) as usize;
                        t.truncate(a);
                        t.extend_from_slice(&other[b..]);
                    }
                    _ => {
                        let i = rng.below(t.len() as u64 + 1) as usize;
                        let len = rng.below(6) as usize + 1;
                        let extra = rng.bytes(len);
                        t.splice(i..i, extra);
                    }
                }
            }
            if rng.below(2) == 0 {
                repair(&mut t);
            }
            b64_encode(&t)
        }
    }
}

/// This thread's CPU time, where Linux tells it.
fn thread_cpu() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(Duration::from_nanos(
        s.split_whitespace().next()?.parse().ok()?,
    ))
}

/// Real tokens from real pages: ascending, descending, signed, over values
/// of many types.
async fn real_tokens(db: &Database) -> (Vec<Vec<u8>>, Vec<Keyset<Document>>) {
    let coll = db.collection::<Document>("fuzz");
    let values: Vec<Bson> = vec![
        Bson::Double(f64::NAN),
        Bson::Double(-1.5),
        Bson::Int32(3),
        Bson::Int64(1 << 40),
        Bson::Null,
        Bson::String("tok".into()),
        Bson::Document(doc! {"a": 1, "b": {"c": "d"}}),
        Bson::Binary(Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![1, 2, 3],
        }),
        Bson::ObjectId(ObjectId::from_bytes([7; 12])),
        Bson::Boolean(true),
        Bson::DateTime(DateTime::from_millis(1)),
        Bson::Timestamp(Timestamp {
            time: 1,
            increment: 2,
        }),
        Bson::Decimal128("1.25".parse().unwrap()),
    ];
    let docs: Vec<Document> = values
        .iter()
        .enumerate()
        .map(|(i, v)| doc! {"_id": i as i64, "v": v.clone(), "t": "a"})
        .collect();
    coll.insert_many(docs).await.unwrap();
    let q = |descending: bool| {
        Keyset::<Document>::new(
            db,
            "fuzz",
            KeysetSpec {
                sort: &["v"],
                descending,
                page_size: 1,
            },
        )
    };
    let queries = vec![
        q(false),
        q(true),
        q(false)
            .filter(doc! {"t": "a"})
            .signing_key(&b"fuzzing key, thirty-two bytes!!!"[..]),
        q(true).by_id(),
    ];
    let mut tokens = Vec::new();
    for query in &queries {
        let pages: Vec<Page<Document>> = query.clone().pages().try_collect().await.unwrap();
        for p in pages {
            for t in p.next.iter().chain(p.prev.iter()) {
                tokens.push(b64_decode(&t.to_string()));
            }
        }
    }
    (tokens, queries)
}

#[tokio::test]
async fn token_decoder_survives_a_million_hostile_inputs() {
    let (db, _) = fresh_db("token_fuzz").await;
    let (real, queries) = tokio::time::timeout(Duration::from_secs(60), real_tokens(&db))
        .await
        .expect("real tokens in time");
    assert!(real.len() > 40, "{} real tokens", real.len());
    let fingerprints: Vec<u64> = real
        .iter()
        .map(|t| u64::from_le_bytes(t[2..10].try_into().unwrap()))
        .collect();
    let fuzz = std::thread::Builder::new()
        .name("token-fuzz".into())
        .stack_size(STACK)
        .spawn(move || {
            let huge = "A".repeat(10 << 20);
            let mut rng = Rng(SEED);
            let cpu0 = thread_cpu();
            let start = Instant::now();
            let (mut accepted, mut used, mut n) = (0u64, 0u64, 0u64);
            let (mut deep, mut long) = (0u64, 0u64);
            while n < INPUTS {
                if n % 4096 == 0 && start.elapsed() > TIME_BOUND {
                    panic!("fuzzing passed its {TIME_BOUND:?} bound after {n} inputs");
                }
                let input = generate(&mut rng, &real, &fingerprints, &huge);
                let outcome = catch_unwind(AssertUnwindSafe(|| {
                    let token = match input.parse::<PageToken>() {
                        Ok(t) => t,
                        Err(Error::InvalidCursor(CursorError::TooDeep { .. })) => {
                            return (false, false, 1, 0)
                        }
                        Err(Error::InvalidCursor(CursorError::TooLong { .. })) => {
                            return (false, false, 0, 1)
                        }
                        Err(Error::InvalidCursor(_)) => return (false, false, 0, 0),
                        Err(other) => panic!("not InvalidCursor: {other:?}"),
                    };
                    // Whatever is accepted writes back the same string.
                    let again = token.to_string();
                    let reparsed: PageToken = again.parse().expect("a token reparses");
                    assert_eq!(reparsed.to_string(), again);
                    // And builds a query, or is refused, without panicking.
                    // (One query a token, in turn, to keep the run short.)
                    let q = queries[(n % queries.len() as u64) as usize].clone();
                    let q = if n / 4 % 2 == 0 {
                        q.after(&token)
                    } else {
                        q.before(&token)
                    };
                    (true, q.command().is_ok(), 0, 0)
                }));
                match outcome {
                    Ok((a, u, d, l)) => {
                        accepted += u64::from(a);
                        used += u64::from(u);
                        deep += d;
                        long += l;
                    }
                    Err(_) => panic!("input {n} panicked: {:?}", &input[..input.len().min(300)]),
                }
                n += 1;
            }
            let cpu = thread_cpu().zip(cpu0).map(|(b, a)| b - a);
            println!("fuzzing thread CPU time: {cpu:?} (wall time depends on the machine's load)");
            (n, accepted, used, deep, long, start.elapsed())
        })
        .unwrap();
    let (n, accepted, used, deep, long, took) = fuzz.join().expect("the fuzzing thread panicked");
    println!(
        "{n} inputs in {took:?} ({:.1} µs each): {accepted} parsed, {used} built a query, \
         {deep} refused as too deep, {long} as too long",
        took.as_secs_f64() * 1e6 / n as f64
    );
    assert_eq!(n, INPUTS);
    assert!(took < TIME_BOUND);
    // The generators reach past the checksum: some inputs parse, some build.
    assert!(
        accepted > 1000 && used > 100,
        "{accepted} parsed, {used} used"
    );
    assert!(
        deep > 10_000 && long > 1000,
        "{deep} too deep, {long} too long"
    );
}
