//! A fault-injecting TCP proxy for the MongoDB wire protocol: it sits on
//! loopback between a driver and one upstream server and does to chosen
//! commands what a failover does to them.
//!
//! The server's own `failCommand` fail point refuses a command *before* the
//! server runs it. A real failover also strikes *after*: the primary applies
//! a write and then steps down before it answers, or the connection drops
//! with the reply on the wire. A retryable write must survive both (the
//! driver retries once with the same `lsid` and `txnNumber`, and the server
//! answers the retry from its record of the first attempt). The proxy gives
//! tests those faults.
//!
//! ```no_run
//! # async fn f(server_uri: &str) {
//! use mongo_patterns_testkit::proxy::{Fault, Proxy, Rule};
//! let proxy = Proxy::start(server_uri);
//! // The next `update` runs on the server, then its reply is lost.
//! proxy.on(Rule::new("update", 1, Fault::CloseAfter));
//! let (client, _) = mongo_patterns_testkit::client(&proxy.uri()).await;
//! # }
//! ```
//!
//! # What it reads
//!
//! Every message, both ways, is a 16-byte header of four little-endian
//! `i32`s (`messageLength`, which counts the header too, `requestID`,
//! `responseTo`, `opCode`) and a body. The proxy reads whole messages and
//! looks inside two kinds:
//!
//! - `OP_MSG` (2013), every command and reply of a current driver: a `u32`
//!   `flagBits`, then sections until the end: kind 0 is one BSON document,
//!   the command's body; kind 1 is a document sequence (an `i32` size that
//!   counts itself, a C-string identifier such as `documents`, then BSON
//!   documents until the size is used). Flag bit 0 says a CRC-32C checksum
//!   ends the message; bit 1 (`moreToCome`) says no reply follows (a
//!   request) or that more replies follow (the streaming `hello` of a
//!   monitoring connection). The command is the kind-0 body with each
//!   sequence folded in as an array under its identifier, as the server
//!   sees it; its name is the body's first key.
//! - `OP_REPLY` (1), the reply to an `OP_QUERY` (2004) handshake: a header,
//!   `responseFlags` `i32`, `cursorID` `i64`, `startingFrom` `i32`,
//!   `numberReturned` `i32`, then the documents. Only its `hello` document is
//!   read (see replica-set mode below).
//!
//! `OP_QUERY` (logged by name), `OP_COMPRESSED` (2012) and anything else
//! pass untouched, and so does an `OP_MSG` request with `moreToCome` (an
//! unacknowledged write, which gets no reply to spoil). Messages the proxy
//! rewrites lose their checksum (it clears flag bit 0 rather than compute a
//! new one; drivers send none unless asked). There is no TLS and no
//! compression: the driver negotiates a compressor only when its URI names
//! one, and a compressed command could be neither matched nor rewritten.
//!
//! # The faults
//!
//! [`Proxy::on`] adds a [`Rule`]: a command name, an optional predicate on
//! the command document, how many matching commands it applies to, and a
//! [`Fault`]. Each command is checked against the rules in the order they
//! were added; the first that matches and has matches left applies,
//! counts a hit ([`Proxy::hits`]) and prints a line to stderr.
//!
//! - [`Fault::ReplyWith`]: the command goes to the server, which applies it
//!   and replies; the proxy drops that reply and answers with the given
//!   document instead (an `OP_MSG` with the same `responseTo`). With
//!   [`Fault::error`] this is a write applied and then reported failed, as
//!   when a primary steps down between applying and answering.
//! - [`Fault::ReplyAsMongod`]: the same, with the error labels `mongod`
//!   would add to that error on that command ([`Fault::election`]):
//!   `RetryableWriteError` on a retryable write (the command carries
//!   `txnNumber` and no `autocommit`) and on `commitTransaction` /
//!   `abortTransaction`, `TransientTransactionError` on a statement inside a
//!   transaction (`autocommit: false`), for the codes `mongod` labels.
//! - [`Fault::WriteConcernError`]: the server's real reply (its `n`, its
//!   `nModified`) relayed with a `writeConcernError` added, and the labels
//!   `mongod` adds for it: a stored write whose replication could not be
//!   confirmed because the primary stepped down.
//! - [`Fault::CloseAfter`]: the command runs on the server, then the proxy
//!   closes the client's connection instead of relaying the reply: the
//!   driver sees a network error for a write that was applied.
//! - [`Fault::CloseBefore`]: the proxy closes the client's connection
//!   without forwarding the command: it never reached the server.
//! - [`Fault::Stall`]: the reply is held for a while, then relayed, so that
//!   a client-side timeout or a heartbeat fires while the command is out.
//! - [`Fault::EmptyMajorityRead`]: a `find` or `aggregate` that asks for
//!   `readConcern: {level: "majority"}` is answered by the proxy with an
//!   empty cursor, as from a new primary whose majority commit point is
//!   still behind a write that survived the election. Other reads do not
//!   match it.
//!
//! Closing a connection closes the proxy's connection to the server too
//! (each client connection has one of its own, opened when the client
//! connects; if the upstream refuses it, the client's is closed).
//!
//! # Replica-set mode
//!
//! Given [`Proxy::uri`] (`directConnection=true`) the driver talks to the
//! proxy's address only. Given [`Proxy::replica_set_uri`] it discovers the
//! deployment from `hello` replies and connects to the hosts they list,
//! which would bypass the proxy; so in every `hello` / `isMaster` reply
//! (recognised by its `isWritablePrimary` or `ismaster` field, in `OP_MSG`
//! and `OP_REPLY` alike) the proxy replaces the upstream's address (as
//! given to [`Proxy::start`], and as the reply's own `me` names it) in
//! `hosts`, `passives`, `arbiters`, `primary` and `me` with its own. A
//! single upstream is all it fronts: other members stay as listed.
//!
//! # Lifetime
//!
//! [`Proxy::start`] binds `127.0.0.1:0` and spawns a task on the current
//! tokio runtime; each connection is a task of that task's. Dropping the
//! [`Proxy`] closes the listener and every connection (promptly, on the
//! runtime); [`Proxy::stop`] does it and waits until all are closed.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongo_patterns::bson::{doc, Bson, Document};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

const OP_REPLY: i32 = 1;
const OP_QUERY: i32 = 2004;
const OP_MSG: i32 = 2013;
const CHECKSUM_PRESENT: u32 = 1;
const MORE_TO_COME: u32 = 1 << 1;
/// Larger than any message a server accepts (48 MB) or sends.
const MAX_MESSAGE: usize = 64 << 20;
/// How many command names [`Proxy::seen`] keeps (the latest).
const SEEN_CAP: usize = 10_000;

/// The codes labelled `RetryableWriteError` on a retryable write or a
/// commit / abort: the retryable-writes specification's list (other codes
/// get no label here).
const RETRYABLE_CODES: &[i32] = &[
    6, 7, 89, 91, 134, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436,
];
/// The codes it labels `TransientTransactionError` inside a transaction:
/// those, a write conflict (112), a lock timeout (24) and a lost
/// transaction (251). Not 50 `MaxTimeMSExpired`.
const TRANSIENT_CODES: &[i32] = &[24, 112, 251];

/// What to do to a matching command. See the [module doc](self).
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Let the server apply it, then answer this document instead.
    ReplyWith(Document),
    /// As `ReplyWith`, with the labels `mongod` puts on the document's
    /// `code` for the command at hand (unless it names `errorLabels`).
    ReplyAsMongod(Document),
    /// Relay the server's reply with this `writeConcernError` added, and
    /// the labels `mongod` puts on its `code` for the command at hand.
    WriteConcernError(Document),
    /// Let the server apply it, then close the client's connection.
    CloseAfter,
    /// Close the client's connection; the server never sees the command.
    CloseBefore,
    /// Let the server apply it, and relay the reply this much later.
    Stall(Duration),
    /// Answer a majority `find` / `aggregate` with an empty cursor.
    EmptyMajorityRead,
}

impl Fault {
    /// `ReplyWith({ok: 0, code, codeName, errmsg})`: no labels (add them
    /// with [`Fault::labels`], or use [`Fault::election`]).
    pub fn error(code: i32, name: &str) -> Fault {
        Fault::ReplyWith(error_doc(code, name))
    }

    /// `code`'s error (named as `mongod` names it, when it is one of the
    /// codes this module knows) with the labels `mongod` would add for the
    /// command it answers: `RetryableWriteError` for a retryable write,
    /// `TransientTransactionError` inside a transaction.
    pub fn election(code: i32) -> Fault {
        Fault::ReplyAsMongod(error_doc(code, code_name(code)))
    }

    /// A `writeConcernError` `{code, codeName, errmsg}` added to the
    /// server's real reply, labelled as `mongod` would: for a step-down after
    /// a stored write, 189 `PrimarySteppedDown` or 91 `ShutdownInProgress`.
    pub fn write_concern_error(code: i32, name: &str) -> Fault {
        let mut wce = error_doc(code, name);
        wce.remove("ok");
        Fault::WriteConcernError(wce)
    }

    /// 11602 `InterruptedDueToReplStateChange`, unlabelled.
    pub fn interrupted_due_to_repl_state_change() -> Fault {
        Fault::error(11602, "InterruptedDueToReplStateChange")
    }

    /// 11600 `InterruptedAtShutdown`, unlabelled.
    pub fn interrupted_at_shutdown() -> Fault {
        Fault::error(11600, "InterruptedAtShutdown")
    }

    /// 50 `MaxTimeMSExpired`, unlabelled.
    pub fn max_time_ms_expired() -> Fault {
        Fault::error(50, "MaxTimeMSExpired")
    }

    /// 91 `ShutdownInProgress`, unlabelled.
    pub fn shutdown_in_progress() -> Fault {
        Fault::error(91, "ShutdownInProgress")
    }

    /// 10107 `NotWritablePrimary`, unlabelled.
    pub fn not_writable_primary() -> Fault {
        Fault::error(10107, "NotWritablePrimary")
    }

    /// The same fault with exactly these `errorLabels` on its document
    /// (for `ReplyWith`, `ReplyAsMongod` and `WriteConcernError`; the last
    /// puts them on the reply). Other faults are returned unchanged.
    pub fn labels(mut self, labels: &[&str]) -> Fault {
        if let Fault::ReplyWith(d) | Fault::ReplyAsMongod(d) | Fault::WriteConcernError(d) =
            &mut self
        {
            d.insert("errorLabels", labels.to_vec());
        }
        self
    }
}

fn error_doc(code: i32, name: &str) -> Document {
    let errmsg = format!("{name} (injected by the test proxy)");
    doc! {"ok": 0.0, "code": code, "codeName": name, "errmsg": errmsg}
}

fn code_name(code: i32) -> &'static str {
    match code {
        50 => "MaxTimeMSExpired",
        91 => "ShutdownInProgress",
        189 => "PrimarySteppedDown",
        10107 => "NotWritablePrimary",
        11600 => "InterruptedAtShutdown",
        11602 => "InterruptedDueToReplStateChange",
        13435 => "NotPrimaryNoSecondaryOk",
        13436 => "NotPrimaryOrSecondary",
        _ => "UnknownError",
    }
}

/// The labels `mongod` puts on error `code` answering command `name`.
fn mongod_labels(name: &str, cmd: &Document, code: i32) -> Vec<&'static str> {
    let retryable = RETRYABLE_CODES.contains(&code);
    let transient = retryable || TRANSIENT_CODES.contains(&code);
    let ends_txn = matches!(name, "commitTransaction" | "abortTransaction");
    let in_txn = cmd.get("autocommit") == Some(&Bson::Boolean(false));
    let retryable_write = cmd.contains_key("txnNumber") && !cmd.contains_key("autocommit");
    if (ends_txn || retryable_write) && retryable {
        vec!["RetryableWriteError"]
    } else if in_txn && transient {
        vec!["TransientTransactionError"]
    } else {
        Vec::new()
    }
}

type Predicate = Arc<dyn Fn(&Document) -> bool + Send + Sync>;

/// Which commands get a [`Fault`], and how many of them.
#[derive(Clone)]
pub struct Rule {
    command: String,
    times: usize,
    when: Option<Predicate>,
    fault: Fault,
}

impl Rule {
    /// The first `times` commands named `command` (`usize::MAX`: all) get
    /// `fault`. `"hello"` also matches the legacy `isMaster` / `ismaster`,
    /// which drivers send for their handshake.
    pub fn new(command: &str, times: usize, fault: Fault) -> Rule {
        Rule {
            command: command.to_owned(),
            times,
            when: None,
            fault,
        }
    }

    /// Only commands for which `predicate` holds (it sees the command with
    /// its document sequences folded in, e.g. `updates` as an array).
    pub fn when(mut self, predicate: impl Fn(&Document) -> bool + Send + Sync + 'static) -> Rule {
        self.when = Some(Arc::new(predicate));
        self
    }

    fn matches(&self, name: &str, cmd: &Document) -> bool {
        let named = name == self.command
            || (self.command == "hello" && name.eq_ignore_ascii_case("isMaster"));
        let readable = !matches!(self.fault, Fault::EmptyMajorityRead)
            || (matches!(name, "find" | "aggregate") && reads_majority(cmd));
        named && readable && self.when.as_ref().is_none_or(|p| p(cmd))
    }
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("command", &self.command)
            .field("times", &self.times)
            .field("when", &self.when.as_ref().map(|_| "<predicate>"))
            .field("fault", &self.fault)
            .finish()
    }
}

fn reads_majority(cmd: &Document) -> bool {
    let level = cmd
        .get_document("readConcern")
        .and_then(|rc| rc.get_str("level"));
    level.ok() == Some("majority")
}

/// What the rules and the log hold, shared by every connection.
#[derive(Default)]
struct Script {
    rules: Vec<(Rule, usize)>,
    seen: VecDeque<String>,
}

struct Shared {
    script: Mutex<Script>,
    upstream: String,
    own: String,
    next_id: AtomicI32,
}

/// A running proxy. See the [module doc](self).
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    // Dropping it tells the accept task to close everything.
    closer: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listens on `127.0.0.1:0` and forwards to `upstream`: `host:port`,
    /// or a single-host `mongodb://` URI whose host it takes. Must be
    /// called inside a tokio runtime.
    pub fn start(upstream: &str) -> Proxy {
        let upstream = upstream_addr(upstream);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("bound address");
        let listener = TcpListener::from_std(listener).expect("inside a tokio runtime");
        let shared = Arc::new(Shared {
            script: Mutex::default(),
            upstream,
            own: addr.to_string(),
            next_id: AtomicI32::new(1 << 30),
        });
        let (closer, closed) = oneshot::channel();
        let task = tokio::spawn(accept(listener, shared.clone(), closed));
        Proxy {
            addr,
            shared,
            closer,
            task,
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `mongodb://127.0.0.1:PORT/?directConnection=true`.
    pub fn uri(&self) -> String {
        format!("mongodb://{}/?directConnection=true", self.addr)
    }

    /// `mongodb://127.0.0.1:PORT/?directConnection=false`: the driver
    /// discovers a replica set through the rewritten `hello` replies.
    pub fn replica_set_uri(&self) -> String {
        format!("mongodb://{}/?directConnection=false", self.addr)
    }

    /// Adds a rule after the others.
    pub fn on(&self, rule: Rule) {
        self.shared.script.lock().unwrap().rules.push((rule, 0));
    }

    /// How many times each rule has applied, in the order they were added.
    pub fn hits(&self) -> Vec<usize> {
        let script = self.shared.script.lock().unwrap();
        script.rules.iter().map(|(_, hits)| *hits).collect()
    }

    /// Removes every rule (and their hits).
    pub fn clear(&self) {
        self.shared.script.lock().unwrap().rules.clear();
    }

    /// The names of the latest commands that came through (the last
    /// 10,000), in order, `hello`s included; `OP_QUERY` ones as
    /// `"OP_QUERY isMaster"`.
    pub fn seen(&self) -> Vec<String> {
        self.shared
            .script
            .lock()
            .unwrap()
            .seen
            .iter()
            .cloned()
            .collect()
    }

    /// Closes the listener and every connection, and waits until they are.
    pub async fn stop(self) {
        drop(self.closer);
        let _ = self.task.await;
    }
}

/// `host:port` from `host:port` or `mongodb://host:port/...`.
fn upstream_addr(upstream: &str) -> String {
    let rest = upstream.strip_prefix("mongodb://").unwrap_or(upstream);
    let host = rest.split(['/', '?']).next().unwrap_or(rest);
    let host = host.rsplit('@').next().unwrap_or(host);
    assert!(!host.contains(','), "one upstream host only: {upstream}");
    host.to_owned()
}

async fn accept(listener: TcpListener, shared: Arc<Shared>, mut closed: oneshot::Receiver<()>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut closed => break,
            accepted = listener.accept() => {
                if let Ok((client, _)) = accepted {
                    conns.spawn(serve(client, shared.clone()));
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    conns.shutdown().await;
}

/// What to do with a request: forward it, close the connection, answer it
/// without the server, or forward it and then do something to its reply.
enum Decision {
    Forward,
    Close,
    Answer(Document),
    After(After),
}

/// What to do with the server's reply to a request.
enum After {
    Replace(Document),
    AddWriteConcernError(Document, Vec<Bson>),
    Close,
    Stall(Duration),
}

/// One client connection: requests up, replies down, until either side
/// closes or a fault closes it. Returning drops both sockets.
async fn serve(client: TcpStream, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(&shared.upstream).await else {
        return;
    };
    let (mut client_in, client_out) = client.into_split();
    let (mut server_in, mut server_out) = server.into_split();
    let client_out = tokio::sync::Mutex::new(client_out);
    let pending: Mutex<HashMap<i32, After>> = Mutex::default();

    let up = async {
        while let Some(msg) = read_message(&mut client_in).await? {
            match shared.decide(&msg) {
                Decision::Forward => {}
                Decision::Close => return Ok(()),
                Decision::Answer(reply) => {
                    let reply = op_msg(shared.id(), request_id(&msg), 0, &reply);
                    client_out.lock().await.write_all(&reply).await?;
                    continue;
                }
                Decision::After(after) => {
                    pending.lock().unwrap().insert(request_id(&msg), after);
                }
            }
            server_out.write_all(&msg).await?;
        }
        Ok::<(), io::Error>(())
    };
    let down = async {
        while let Some(msg) = read_message(&mut server_in).await? {
            let after = pending.lock().unwrap().remove(&response_to(&msg));
            let msg = match after {
                None => shared.rewrite_hello(msg),
                Some(After::Close) => return Ok(()),
                Some(After::Stall(d)) => {
                    tokio::time::sleep(d).await;
                    shared.rewrite_hello(msg)
                }
                Some(After::Replace(body)) => op_msg(request_id(&msg), response_to(&msg), 0, &body),
                Some(After::AddWriteConcernError(wce, labels)) => {
                    add_write_concern_error(msg, wce, labels)
                }
            };
            client_out.lock().await.write_all(&msg).await?;
        }
        Ok::<(), io::Error>(())
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

impl Shared {
    fn id(&self) -> i32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Logs the request and picks what happens to it.
    fn decide(&self, msg: &[u8]) -> Decision {
        let op = op_code(msg);
        let parsed = match op {
            OP_MSG => parse_op_msg(msg).ok(),
            OP_QUERY => {
                if let Some(name) = op_query_name(msg) {
                    self.log(format!("OP_QUERY {name}"));
                }
                None
            }
            _ => None,
        };
        let Some(OpMsg {
            flags,
            command: cmd,
            ..
        }) = parsed
        else {
            return Decision::Forward;
        };
        let name = cmd.keys().next().cloned().unwrap_or_default();
        self.log(name.clone());
        if flags & MORE_TO_COME != 0 {
            return Decision::Forward;
        }
        let fault = {
            let mut script = self.script.lock().unwrap();
            let rule = script
                .rules
                .iter_mut()
                .enumerate()
                .find(|(_, (rule, hits))| *hits < rule.times && rule.matches(&name, &cmd));
            match rule {
                None => return Decision::Forward,
                Some((i, (rule, hits))) => {
                    *hits += 1;
                    eprintln!("proxy: rule {i} ({name}, hit {hits}): {:?}", rule.fault);
                    rule.fault.clone()
                }
            }
        };
        match fault {
            Fault::CloseBefore => Decision::Close,
            Fault::EmptyMajorityRead => Decision::Answer(empty_cursor(&name, &cmd)),
            Fault::CloseAfter => Decision::After(After::Close),
            Fault::Stall(d) => Decision::After(After::Stall(d)),
            Fault::ReplyWith(reply) => Decision::After(After::Replace(reply)),
            Fault::ReplyAsMongod(mut reply) => {
                if !reply.contains_key("errorLabels") {
                    let code = reply.get_i32("code").unwrap_or(0);
                    let labels = mongod_labels(&name, &cmd, code);
                    if !labels.is_empty() {
                        reply.insert("errorLabels", labels);
                    }
                }
                Decision::After(After::Replace(reply))
            }
            Fault::WriteConcernError(mut wce) => {
                let code = wce.get_i32("code").unwrap_or(0);
                let labels = match wce.remove("errorLabels") {
                    Some(Bson::Array(given)) => given,
                    _ => mongod_labels(&name, &cmd, code)
                        .into_iter()
                        .map(Bson::from)
                        .collect(),
                };
                Decision::After(After::AddWriteConcernError(wce, labels))
            }
        }
    }

    fn log(&self, name: String) {
        let mut script = self.script.lock().unwrap();
        if script.seen.len() == SEEN_CAP {
            script.seen.pop_front();
        }
        script.seen.push_back(name);
    }

    /// A reply with a `hello` document in it, with the upstream's address
    /// replaced by the proxy's; any other message as it is.
    fn rewrite_hello(&self, msg: Vec<u8>) -> Vec<u8> {
        match op_code(&msg) {
            OP_MSG => {
                let Ok(mut reply) = parse_op_msg(&msg) else {
                    return msg;
                };
                if !self.rewrite_hosts(&mut reply.body) {
                    return msg;
                }
                let flags = reply.flags & MORE_TO_COME;
                op_msg(request_id(&msg), response_to(&msg), flags, &reply.body)
            }
            OP_REPLY => {
                // header, responseFlags, cursorID, startingFrom, numberReturned
                let Some(docs) = msg.get(36..) else {
                    return msg;
                };
                let Ok((mut hello, len)) = read_doc(docs) else {
                    return msg;
                };
                if !self.rewrite_hosts(&mut hello) {
                    return msg;
                }
                let mut out = msg[..36].to_vec();
                hello.to_writer(&mut out).expect("a document encodes");
                out.extend_from_slice(&docs[len..]);
                set_length(out)
            }
            _ => msg,
        }
    }

    /// Whether `reply` is a `hello` that named the upstream (now renamed).
    fn rewrite_hosts(&self, reply: &mut Document) -> bool {
        if !reply.contains_key("isWritablePrimary") && !reply.contains_key("ismaster") {
            return false;
        }
        let me = reply.get_str("me").ok().map(str::to_owned);
        let upstream = |h: &str| h.eq_ignore_ascii_case(&self.upstream) || Some(h) == me.as_deref();
        let mut changed = false;
        let mut rename = |v: &mut Bson| {
            if let Bson::String(host) = v {
                if upstream(host) {
                    *host = self.own.clone();
                    changed = true;
                }
            }
        };
        for key in ["hosts", "passives", "arbiters"] {
            if let Some(Bson::Array(hosts)) = reply.get_mut(key) {
                hosts.iter_mut().for_each(&mut rename);
            }
        }
        for key in ["primary", "me"] {
            if let Some(v) = reply.get_mut(key) {
                rename(v);
            }
        }
        changed
    }
}

/// A cursor with no documents, as `find` / `aggregate` answer.
fn empty_cursor(name: &str, cmd: &Document) -> Document {
    let db = cmd.get_str("$db").unwrap_or("test");
    let coll = cmd.get_str(name).unwrap_or("$cmd.aggregate");
    let empty: Vec<Document> = Vec::new();
    doc! {"cursor": {"firstBatch": empty, "id": 0_i64, "ns": format!("{db}.{coll}")}, "ok": 1.0}
}

fn add_write_concern_error(msg: Vec<u8>, wce: Document, labels: Vec<Bson>) -> Vec<u8> {
    let Ok(OpMsg { mut body, .. }) = parse_op_msg(&msg) else {
        return msg;
    };
    body.insert("writeConcernError", wce);
    if !labels.is_empty() {
        let mut all = match body.remove("errorLabels") {
            Some(Bson::Array(given)) => given,
            _ => Vec::new(),
        };
        all.extend(labels);
        body.insert("errorLabels", all);
    }
    op_msg(request_id(&msg), response_to(&msg), 0, &body)
}

// ---------------------------------------------------------------- the wire

fn i32_at(msg: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(msg[at..at + 4].try_into().expect("four bytes"))
}

fn request_id(msg: &[u8]) -> i32 {
    i32_at(msg, 4)
}

fn response_to(msg: &[u8]) -> i32 {
    i32_at(msg, 8)
}

fn op_code(msg: &[u8]) -> i32 {
    i32_at(msg, 12)
}

fn invalid(why: impl fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

/// One whole message (header included), or `None` when the peer closed.
async fn read_message(from: &mut (impl AsyncRead + Unpin)) -> io::Result<Option<Vec<u8>>> {
    let mut msg = vec![0; 16];
    match from.read_exact(&mut msg).await {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        done => done?,
    };
    let len = usize::try_from(i32_at(&msg, 0)).map_err(invalid)?;
    if !(16..=MAX_MESSAGE).contains(&len) {
        return Err(invalid(format!("message length {len}")));
    }
    msg.resize(len, 0);
    from.read_exact(&mut msg[16..]).await?;
    Ok(Some(msg))
}

/// An `OP_MSG`: its flags, its body, and the command (the body with the
/// document sequences folded in).
struct OpMsg {
    flags: u32,
    body: Document,
    command: Document,
}

fn parse_op_msg(msg: &[u8]) -> io::Result<OpMsg> {
    let flags = u32::from_le_bytes(
        msg.get(16..20)
            .ok_or_else(|| invalid("short"))?
            .try_into()
            .unwrap(),
    );
    let end = msg.len() - if flags & CHECKSUM_PRESENT != 0 { 4 } else { 0 };
    let mut at = 20;
    let mut body = None;
    let mut sequences = Vec::new();
    while at < end {
        let kind = msg[at];
        at += 1;
        let rest = msg.get(at..end).ok_or_else(|| invalid("short"))?;
        match kind {
            0 => {
                let (doc, len) = read_doc(rest)?;
                body = Some(doc);
                at += len;
            }
            1 => {
                let size = usize::try_from(i32_at(rest, 0)).map_err(invalid)?;
                let section = rest.get(4..size).ok_or_else(|| invalid("short sequence"))?;
                let nul = section
                    .iter()
                    .position(|&b| b == 0)
                    .ok_or_else(|| invalid("no C string"))?;
                let id = String::from_utf8_lossy(&section[..nul]).into_owned();
                let mut docs = Vec::new();
                let mut d = nul + 1;
                while d < section.len() {
                    let (doc, len) = read_doc(&section[d..])?;
                    docs.push(Bson::Document(doc));
                    d += len;
                }
                sequences.push((id, docs));
                at += size;
            }
            k => return Err(invalid(format!("section kind {k}"))),
        }
    }
    let body = body.ok_or_else(|| invalid("no body section"))?;
    let mut command = body.clone();
    for (id, docs) in sequences {
        command.insert(id, docs);
    }
    Ok(OpMsg {
        flags,
        body,
        command,
    })
}

/// The BSON document at the start of `bytes`, and its length.
fn read_doc(bytes: &[u8]) -> io::Result<(Document, usize)> {
    let len = usize::try_from(i32_at(bytes.get(..4).ok_or_else(|| invalid("short"))?, 0))
        .map_err(invalid)?;
    let raw = bytes.get(..len).ok_or_else(|| invalid("short document"))?;
    Ok((Document::from_reader(raw).map_err(invalid)?, len))
}

/// An `OP_MSG` with `flags` and one body section.
fn op_msg(request_id: i32, response_to: i32, flags: u32, body: &Document) -> Vec<u8> {
    let mut msg = Vec::with_capacity(256);
    for field in [0, request_id, response_to, OP_MSG] {
        msg.extend_from_slice(&field.to_le_bytes());
    }
    msg.extend_from_slice(&flags.to_le_bytes());
    msg.push(0);
    body.to_writer(&mut msg).expect("a document encodes");
    set_length(msg)
}

fn set_length(mut msg: Vec<u8>) -> Vec<u8> {
    let len = i32::try_from(msg.len()).expect("a message under 2 GB");
    msg[..4].copy_from_slice(&len.to_le_bytes());
    msg
}

/// The command name of an `OP_QUERY` (flags, collection C string, skip,
/// return count, then the query document, maybe wrapped in `$query`).
fn op_query_name(msg: &[u8]) -> Option<String> {
    let rest = msg.get(20..)?;
    let nul = rest.iter().position(|&b| b == 0)?;
    let (query, _) = read_doc(rest.get(nul + 9..)?).ok()?;
    let query = query.get_document("$query").cloned().unwrap_or(query);
    query.keys().next().cloned()
}
