//! The rank histogram when a failover strikes after the server ran a
//! write: the test kit's proxy (`testkit::proxy`) replaces the reply of a
//! write the server applied with an election's error, labelled as
//! `mongod` labels it (`Fault::election`), or closes the connection
//! instead of relaying it (`Fault::CloseAfter`). A retryable write is sent
//! once more by the driver and de-duplicated by the server, statement by
//! statement: each call returns `Ok`, and the histogram, read straight
//! from the server, equals the players regrouped by score.
//!
//! Every test runs on a server of its own, behind a proxy of its own; a
//! second client goes straight to the server to set up and to read what
//! is stored.

use std::collections::BTreeMap;

use mongo_patterns::bson::{Bson, Document};
use mongo_patterns::prelude::*;
use mongo_patterns::rank_histogram::Layout;
use mongo_patterns_testkit::proxy::{Fault, Proxy, Rule};
use mongo_patterns_testkit::{
    bounded, client, strict_validators, Commands, OwnServer, ServerOptions,
};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "fo_scores")]
#[rank_histogram(board = "examId", score = "score", layout = "documents")]
struct DocsScore {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "fo_scores_array")]
#[rank_histogram(board = "examId", score = "score")]
struct ArrayScore {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: i64,
}

trait Player: RankHistogram<Board = String, Score = i64> + Clone {
    fn new(student: &str, exam: &str, score: i64) -> Self;
}

impl Player for DocsScore {
    fn new(student: &str, exam: &str, score: i64) -> Self {
        DocsScore {
            student: student.into(),
            exam_id: exam.into(),
            score,
        }
    }
}

impl Player for ArrayScore {
    fn new(student: &str, exam: &str, score: i64) -> Self {
        ArrayScore {
            student: student.into(),
            exam_id: exam.into(),
            score,
        }
    }
}

/// A server, the proxy in front of it, a client through the proxy and one
/// straight to the server.
struct Rig {
    proxy: Proxy,
    db: Database,
    commands: Commands,
    direct: Database,
    // Last: the server stops after the clients and the proxy are gone.
    _server: OwnServer,
}

impl Rig {
    /// The client checks the server every 500 ms (the least the driver
    /// takes), as an application's would in an election: after an
    /// election's error the driver selects the server again once a check
    /// finds it.
    async fn new(name: &str) -> Rig {
        let server = OwnServer::start(ServerOptions::default());
        let proxy = Proxy::start(server.uri());
        let uri = format!("{}&heartbeatFrequencyMS=500", proxy.uri());
        let (c, commands) = client(&uri).await;
        let (direct, _) = client(server.uri()).await;
        // Every model's validator at `strict`: no retry, lookup or
        // replay after a fault may store what an invariant refuses.
        let direct = direct.database(name);
        strict_validators(
            &direct,
            [DocsScore::declared(&direct), ArrayScore::declared(&direct)].concat(),
        )
        .await;
        Rig {
            proxy,
            db: c.database(name),
            commands,
            direct,
            _server: server,
        }
    }

    /// Adds `rule`, runs `call`, and checks that the rule applied once.
    async fn faulted<F, R>(&self, rule: Rule, what: &str, call: F) -> R
    where
        F: std::future::IntoFuture<Output = Result<R, Error>>,
        R: std::fmt::Debug,
    {
        self.proxy.clear();
        self.commands.take();
        self.proxy.on(rule);
        let r = bounded(60, call).await;
        let sent: Vec<String> = self.commands.take().into_iter().map(|(n, _)| n).collect();
        println!("{what}: {r:?}; the driver sent {sent:?}");
        assert_eq!(self.proxy.hits(), [1], "{what}: the fault applied");
        self.proxy.clear();
        r.unwrap_or_else(|e| panic!("{what}: {e:?}"))
    }

    /// Board `b` as stored (score → count), read straight from the server;
    /// counts of 0 and the documents layout's marker left out.
    async fn stored<T: Player>(&self, b: &str) -> BTreeMap<i64, i64> {
        let hist = self.direct.collection::<Document>(T::RANK.histogram);
        let mut out = BTreeMap::new();
        let mut add = |s: &Bson, c: &Bson| {
            let (Some(s), Some(c)) = (int(s), int(c)) else {
                return;
            };
            if c != 0 {
                assert!(out.insert(s, c).is_none(), "score {s} stored twice");
            }
        };
        match T::RANK.layout {
            Layout::Array => {
                let board = bounded(10, hist.find_one(doc! {"_id": b})).await.unwrap();
                for e in board
                    .iter()
                    .flat_map(|d| d.get_array("scores").ok())
                    .flatten()
                {
                    let e = e.as_document().unwrap();
                    add(e.get("score").unwrap(), e.get("count").unwrap());
                }
            }
            Layout::Documents => {
                let docs: Vec<Document> = bounded(10, async {
                    hist.find(doc! {"_id.b": b})
                        .await
                        .unwrap()
                        .try_collect()
                        .await
                })
                .await
                .unwrap();
                for d in docs {
                    let s = d.get_document("_id").unwrap().get("s").unwrap();
                    add(s, d.get("count").unwrap());
                }
            }
        }
        out
    }

    /// The players of board `b`, regrouped by score, read straight from the
    /// server.
    async fn players<T: Player>(&self, b: &str) -> BTreeMap<i64, i64> {
        let players = self.direct.collection::<Document>(T::COLLECTION);
        let docs: Vec<Document> = bounded(10, async {
            players
                .find(doc! {"examId": b})
                .await
                .unwrap()
                .try_collect()
                .await
        })
        .await
        .unwrap();
        let mut out = BTreeMap::new();
        for d in docs {
            *out.entry(int(d.get("score").unwrap()).unwrap())
                .or_insert(0) += 1;
        }
        out
    }

    /// The histogram of `b` equals its players, and is `want`.
    async fn agrees<T: Player>(&self, b: &str, want: &[(i64, i64)], what: &str) {
        let (stored, players) = (self.stored::<T>(b).await, self.players::<T>(b).await);
        assert_eq!(stored, players, "{what}: the histogram against the players");
        assert_eq!(stored, BTreeMap::from_iter(want.iter().copied()), "{what}");
    }

    /// Sets player `p` of board `b` to `score` (inserting it), straight on
    /// the server, without touching the histogram.
    async fn set_player<T: Player>(&self, p: &str, b: &str, score: i64) {
        let players = self.direct.collection::<Document>(T::COLLECTION);
        let set = doc! {"$set": {"examId": b, "score": score}};
        bounded(10, players.update_one(doc! {"_id": p}, set).upsert(true))
            .await
            .unwrap();
    }

    async fn remove_player<T: Player>(&self, p: &str) {
        let players = self.direct.collection::<Document>(T::COLLECTION);
        bounded(10, players.delete_one(doc! {"_id": p}))
            .await
            .unwrap();
    }
}

fn int(b: &Bson) -> Option<i64> {
    match b {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(f) => Some(*f as i64),
        _ => None,
    }
}

/// The faults of a failover after the server applied a write: the reply
/// replaced by 11602 (`InterruptedDueToReplStateChange`, labelled as
/// `mongod` labels it for the command at hand), or lost with its
/// connection.
fn faults() -> [(&'static str, Fault); 2] {
    [
        ("11602 after it ran", Fault::election(11602)),
        ("reply lost", Fault::CloseAfter),
    ]
}

/// Whether write command `cmd` (an `update`, a `delete` or a `bulkWrite`)
/// has a statement on the documents layout's document of score `s`.
fn names_score(cmd: &Document, s: i64) -> bool {
    [("updates", "q"), ("deletes", "q"), ("ops", "filter")]
        .iter()
        .any(|(list, filter)| {
            let statements = cmd.get_array(list).map(|a| a.as_slice()).unwrap_or(&[]);
            statements.iter().filter_map(Bson::as_document).any(|st| {
                let id = st.get_document(filter).and_then(|q| q.get_document("_id"));
                id.ok().and_then(|id| id.get("s")).and_then(int) == Some(s)
            })
        })
}

/// The rule that strikes the histogram write of a documents-layout call
/// that touches score `s`: its `bulkWrite`, or without it the `update`
/// that carries the statement on `s`.
fn on_histogram_write(bulk: bool, s: i64, fault: Fault) -> Rule {
    let command = if bulk { "bulkWrite" } else { "update" };
    Rule::new(command, 1, fault).when(move |cmd| names_score(cmd, s))
}

/// `record`, `change` and `unrecord` of the documents layout, with the
/// reply of their histogram write replaced by 11602 after the server
/// applied it, or lost with its connection: `Ok`, applied once. Two
/// players hold score 1; one of them moves to 2 (`change(b, 1, 2)`), a
/// third comes at 5 (`record`) and goes (`unrecord`).
async fn histogram_writes(bulk: bool) {
    let rig = Rig::new(&format!("fo_writes_{bulk}")).await;
    let ranks = DocsScore::ranks(&rig.db).bulk_write(bulk);
    for (what, fault) in faults() {
        let b = format!("b-{what}");
        for p in ["p0", "p1"] {
            rig.set_player::<DocsScore>(p, &b, 1).await;
        }
        bounded(10, DocsScore::ranks(&rig.direct).rebuild(&b))
            .await
            .unwrap();
        rig.agrees::<DocsScore>(&b, &[(1, 2)], what).await;

        rig.set_player::<DocsScore>("p0", &b, 2).await;
        let rule = on_histogram_write(bulk, 1, fault.clone());
        let call = format!("bulk {bulk}, {what}: change(1, 2)");
        rig.faulted(rule, &call, ranks.change(&b, 1, 2)).await;
        rig.agrees::<DocsScore>(&b, &[(1, 1), (2, 1)], &call).await;

        rig.set_player::<DocsScore>("p2", &b, 5).await;
        let rule = on_histogram_write(bulk, 5, fault.clone());
        let call = format!("bulk {bulk}, {what}: record(5)");
        rig.faulted(rule, &call, ranks.record(&b, 5)).await;
        rig.agrees::<DocsScore>(&b, &[(1, 1), (2, 1), (5, 1)], &call)
            .await;

        rig.remove_player::<DocsScore>("p2").await;
        let rule = on_histogram_write(bulk, 5, fault);
        let call = format!("bulk {bulk}, {what}: unrecord(5)");
        rig.faulted(rule, &call, ranks.unrecord(&b, 5)).await;
        rig.agrees::<DocsScore>(&b, &[(1, 1), (2, 1)], &call).await;
    }
}

#[tokio::test]
async fn histogram_writes_survive_a_failover_after_they_ran() {
    bounded(120, histogram_writes(true)).await;
}

#[tokio::test]
async fn histogram_writes_survive_a_failover_after_they_ran_without_bulk_write() {
    bounded(120, histogram_writes(false)).await;
}

/// `insert`, `update_score` and `delete` (the player and the histogram in
/// one transaction of the call's own) with each of their commands struck
/// in turn, the commit included: `Ok`, and the histogram equals the
/// players. `hist` is the histogram write's command.
async fn transactional_writes<T: Player>(name: &str, bulk: bool) {
    let rig = Rig::new(name).await;
    let ranks = T::ranks(&rig.db).bulk_write(bulk);
    let hist = match (T::RANK.layout, bulk) {
        (Layout::Documents, true) => "bulkWrite",
        _ => "update",
    };
    // `insert` as one cross-collection `bulkWrite` where allowed.
    let insert: &[&str] = if bulk {
        &["bulkWrite", "commitTransaction"]
    } else {
        &["insert", hist, "commitTransaction"]
    };
    let moves = ["findAndModify", hist, "commitTransaction"];
    let mut n = 0;
    for (what, fault) in faults() {
        for command in insert {
            n += 1;
            let (p, b) = (format!("p{n}"), format!("b{n}"));
            let call = format!("{name}, {what} on {command}: insert");
            let rule = Rule::new(command, 1, fault.clone());
            rig.faulted(rule, &call, ranks.insert(&T::new(&p, &b, 10)))
                .await;
            rig.agrees::<T>(&b, &[(10, 1)], &call).await;
        }
        for command in moves {
            n += 1;
            let (p, b) = (format!("p{n}"), format!("b{n}"));
            bounded(30, ranks.insert(&T::new(&p, &b, 10)))
                .await
                .unwrap();
            bounded(30, ranks.insert(&T::new(&format!("q{n}"), &b, 10)))
                .await
                .unwrap();
            let call = format!("{name}, {what} on {command}: update_score");
            let rule = Rule::new(command, 1, fault.clone());
            let hit = rig
                .faulted(rule, &call, ranks.update_score(doc! {"_id": &p}, 20))
                .await;
            assert!(hit, "{call}");
            rig.agrees::<T>(&b, &[(10, 1), (20, 1)], &call).await;

            let call = format!("{name}, {what} on {command}: delete");
            let rule = Rule::new(command, 1, fault.clone());
            let hit = rig
                .faulted(rule, &call, ranks.delete(doc! {"_id": &p}))
                .await;
            assert!(hit, "{call}");
            rig.agrees::<T>(&b, &[(10, 1)], &call).await;
        }
    }
}

#[tokio::test]
async fn transactional_writes_survive_a_failover_documents() {
    bounded(240, transactional_writes::<DocsScore>("fo_txn_docs", true)).await;
}

#[tokio::test]
async fn transactional_writes_survive_a_failover_documents_without_bulk_write() {
    bounded(
        240,
        transactional_writes::<DocsScore>("fo_txn_docs_fb", false),
    )
    .await;
}

#[tokio::test]
async fn transactional_writes_survive_a_failover_array() {
    bounded(
        240,
        transactional_writes::<ArrayScore>("fo_txn_array", true),
    )
    .await;
}

/// The same calls on a deployment without transactions, where the
/// repository may write the player and then the histogram
/// (`allow_non_atomic`): the player's write and each histogram write
/// (`+1` at the new score, then `-1` at the old one) struck in turn.
async fn non_atomic_writes(bulk: bool) {
    let rig = Rig::new(&format!("fo_non_atomic_{bulk}")).await;
    let ranks = DocsScore::ranks(&rig.db)
        .bulk_write(bulk)
        .transactions(false)
        .allow_non_atomic(true);
    let hist = if bulk { "bulkWrite" } else { "update" };
    let mut n = 0;
    for (what, fault) in faults() {
        // The player's `insert`, then its `+1` at 10.
        for (command, s) in [("insert", None), (hist, Some(10))] {
            n += 1;
            let (p, b) = (format!("p{n}"), format!("b{n}"));
            let call = format!("bulk {bulk}, {what} on {command}: insert");
            let mut rule = Rule::new(command, 1, fault.clone());
            if let Some(s) = s {
                rule = rule.when(move |cmd| names_score(cmd, s));
            }
            rig.faulted(rule, &call, ranks.insert(&DocsScore::new(&p, &b, 10)))
                .await;
            rig.agrees::<DocsScore>(&b, &[(10, 1)], &call).await;
        }
        // The player's `findAndModify`, its `+1` at 20, its `-1` at 10.
        for (command, s) in [("findAndModify", None), (hist, Some(20)), (hist, Some(10))] {
            n += 1;
            let (p, b) = (format!("p{n}"), format!("b{n}"));
            for q in [&p, &format!("q{n}")] {
                bounded(30, ranks.insert(&DocsScore::new(q, &b, 10)))
                    .await
                    .unwrap();
            }
            let call = format!("bulk {bulk}, {what} on {command} ({s:?}): update_score");
            let mut rule = Rule::new(command, 1, fault.clone());
            if let Some(s) = s {
                rule = rule.when(move |cmd| names_score(cmd, s));
            }
            let hit = rig
                .faulted(rule, &call, ranks.update_score(doc! {"_id": &p}, 20))
                .await;
            assert!(hit, "{call}");
            rig.agrees::<DocsScore>(&b, &[(10, 1), (20, 1)], &call)
                .await;
        }
        // The player's `findAndModify`, its `-1` at 10.
        for (command, s) in [("findAndModify", None), (hist, Some(10))] {
            n += 1;
            let (p, b) = (format!("p{n}"), format!("b{n}"));
            for q in [&p, &format!("q{n}")] {
                bounded(30, ranks.insert(&DocsScore::new(q, &b, 10)))
                    .await
                    .unwrap();
            }
            let call = format!("bulk {bulk}, {what} on {command}: delete");
            let mut rule = Rule::new(command, 1, fault.clone());
            if let Some(s) = s {
                rule = rule.when(move |cmd| names_score(cmd, s));
            }
            let hit = rig
                .faulted(rule, &call, ranks.delete(doc! {"_id": &p}))
                .await;
            assert!(hit, "{call}");
            rig.agrees::<DocsScore>(&b, &[(10, 1)], &call).await;
        }
    }
}

#[tokio::test]
async fn non_atomic_writes_survive_a_failover() {
    bounded(240, non_atomic_writes(true)).await;
}

#[tokio::test]
async fn non_atomic_writes_survive_a_failover_without_bulk_write() {
    bounded(240, non_atomic_writes(false)).await;
}

/// Two faults in a row on the same write: the driver sends a retryable
/// write once more, not twice, so the call fails; it says the outcome is
/// unknown, and the write is stored once (not twice).
#[tokio::test]
async fn two_failovers_in_a_row_are_an_unknown_outcome_stored_once() {
    bounded(120, async {
        let rig = Rig::new("fo_twice").await;
        for bulk in [true, false] {
            let ranks = DocsScore::ranks(&rig.db).bulk_write(bulk);
            let b = format!("b-{bulk}");
            rig.set_player::<DocsScore>("p0", &b, 1).await;
            bounded(10, DocsScore::ranks(&rig.direct).rebuild(&b))
                .await
                .unwrap();
            rig.set_player::<DocsScore>("p0", &b, 2).await;
            rig.proxy.clear();
            let command = if bulk { "bulkWrite" } else { "update" };
            let rule = Rule::new(command, 2, Fault::CloseAfter).when(|cmd| names_score(cmd, 1));
            rig.proxy.on(rule);
            let r = bounded(60, ranks.change(&b, 1, 2)).await;
            println!("bulk {bulk}: two lost replies: {r:?}");
            assert_eq!(rig.proxy.hits(), [2], "bulk {bulk}");
            assert!(
                matches!(r, Err(Error::OutcomeUnknown { .. })),
                "bulk {bulk}: {r:?}"
            );
            rig.proxy.clear();
            // The `-1` is stored once; without `bulkWrite` the statements
            // after it were not sent.
            let stored = rig.stored::<DocsScore>(&b).await;
            let want = if bulk {
                BTreeMap::from([(2, 1)])
            } else {
                BTreeMap::new()
            };
            assert_eq!(stored, want, "bulk {bulk}");
            // A rebuild repairs it.
            bounded(10, ranks.rebuild(&b)).await.unwrap();
            rig.agrees::<DocsScore>(&b, &[(2, 1)], "rebuilt").await;
        }
    })
    .await;
}
