//! Test support shared by the integration tests, the examples and the
//! benchmarks: a MongoDB-wire server to talk to, a fresh database per test,
//! and a count of the commands each operation sends.
//!
//! `MONGODB_URI` wins when set, so the same suite runs against a real
//! `mongod` or Atlas. Otherwise the pinned surrogate server (`secantusd-rs`,
//! see CONTRIBUTING.md, "The test server") is started once per process on a free port with a
//! temporary storage directory; it stops, and its directory is removed, when
//! the process exits, even if the process is killed.

pub mod bench;
pub mod explain;
pub mod forge;
pub mod proxy;
pub mod routing;

pub use explain::Explain;
pub use routing::{Routing, ShardKey};

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use mongo_patterns::mongodb::event::command::CommandEvent;
use mongo_patterns::mongodb::event::EventHandler;
use mongo_patterns::mongodb::options::ClientOptions;
use mongo_patterns::mongodb::{Client, Database};

/// The pinned server version; `scripts/test-server` installs it.
pub const SERVER_CRATE: &str = "secantus-mdb";
pub const SERVER_VERSION: &str = "0.5.3-beta.196";
const START_TIMEOUT: Duration = Duration::from_secs(60);

struct Server {
    uri: String,
    // Held so the watchdog's stdin stays open for the life of the process.
    _child: Mutex<Child>,
}

static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();

/// The connection string: `MONGODB_URI`, or a surrogate server started now.
/// Panics with instructions if neither is possible; tests cannot run without
/// a server, and saying why is the useful thing to do.
pub fn server_uri() -> String {
    if let Ok(uri) = std::env::var("MONGODB_URI") {
        if !uri.is_empty() {
            return uri;
        }
    }
    match SERVER.get_or_init(start_server) {
        Ok(s) => s.uri.clone(),
        Err(e) => panic!("no test server: {e}"),
    }
}

/// Where the surrogate's binary is: `$SECANTUSD`, `secantusd-rs` on `PATH`,
/// or the cache that `scripts/test-server` installs into.
pub fn server_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SECANTUSD") {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("secantusd-rs"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let p = cache_dir()?
            .join(format!("{SERVER_CRATE}-{SERVER_VERSION}"))
            .join("bin/secantusd-rs");
        p.is_file().then_some(p)
    })
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MONGO_PATTERNS_CACHE") {
        return Some(PathBuf::from(p));
    }
    let home = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(home.join("mongo-patterns"))
}

fn start_server() -> Result<Server, String> {
    let bin = server_binary().ok_or_else(|| {
        "MONGODB_URI is unset and secantusd-rs was not found; run `scripts/test-server` (installs it into the cache) or set SECANTUSD".to_owned()
    })?;
    let dir = std::env::temp_dir().join(format!(
        "mongo-patterns-{}-{}",
        std::process::id(),
        unique()
    ));
    // The shell is a watchdog: it starts the server, then blocks reading our
    // stdin pipe. When this process exits, however it exits, the pipe closes,
    // `cat` returns, and the server is stopped and its directory removed.
    let script = r#"
        "$0" --port 0 --storage-path "$1" --log-file-max 16MB --cache-size 512M --log-level WARNING <&- &
        pid=$!
        cat >/dev/null
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        rm -rf "$1"
    "#;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(&bin)
        .arg(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref().map_while(Result::ok) {
            if let Some(addr) = line.split("listening on ").nth(1) {
                let _ = tx.send(addr.trim().to_owned());
                break;
            }
        }
        // Keep draining so the server never blocks on a full pipe.
        for _ in lines {}
    });
    let addr = rx.recv_timeout(START_TIMEOUT).map_err(|_| {
        let _ = child.kill();
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        format!(
            "{} did not report a port within {START_TIMEOUT:?}: {err}",
            bin.display()
        )
    })?;
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut stderr, &mut std::io::sink());
    });
    Ok(Server {
        uri: format!("mongodb://{addr}/?directConnection=true"),
        _child: Mutex::new(child),
    })
}

/// How to start a server of a test's own.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerOptions {
    /// Advertise a standalone in `hello` (`--standalone`).
    pub standalone: bool,
    /// Make every acknowledged write durable before the reply
    /// (`--sync-on-commit`): then a `kill -9` loses no acknowledged write.
    pub sync_on_commit: bool,
    /// Accept `configureFailPoint` (`--enable-test-commands`), as mongod
    /// does with `enableTestCommands`.
    pub test_commands: bool,
}

/// A server of one test's own, which the test can kill (`kill -9`) and
/// start again in place, on the same port and storage: for crash tests.
///
/// It always runs the surrogate (`MONGODB_URI` cannot be killed from here),
/// and stops with its directory removed when the process exits, however it
/// exits.
pub struct OwnServer {
    uri: String,
    port: u16,
    control: Mutex<ChildStdin>,
    events: Mutex<Receiver<String>>,
    // Held so the watchdog lives as long as the handle.
    _child: Mutex<Child>,
}

impl OwnServer {
    /// Starts a server on a free port with a fresh storage directory. Panics
    /// with instructions when the surrogate is not installed.
    pub fn start(opts: ServerOptions) -> OwnServer {
        let bin = server_binary().expect(
            "secantusd-rs was not found; run `scripts/test-server` (installs it into the cache) or set SECANTUSD",
        );
        let dir = std::env::temp_dir().join(format!(
            "mongo-patterns-own-{}-{}",
            std::process::id(),
            unique()
        ));
        let mut flags = Vec::new();
        if opts.standalone {
            flags.push("--standalone");
        }
        if opts.sync_on_commit {
            flags.push("--sync-on-commit");
        }
        if opts.test_commands {
            flags.push("--enable-test-commands");
        }
        // A watchdog as in `start_server`, that also takes commands on its
        // stdin: `kill` (SIGKILL, then says `killed`) and `start PORT`.
        let script = r#"
            bin=$0; dir=$1; shift
            port=0
            start() {
                "$bin" --port "$port" --storage-path "$dir" --log-file-max 16MB --cache-size 256M --log-level WARNING "$@" <&- &
                pid=$!
            }
            start "$@"
            while read -r cmd arg; do
                case "$cmd" in
                    kill) kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; echo killed ;;
                    start) port=$arg; start "$@" ;;
                esac
            done
            kill "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
            rm -rf "$dir"
        "#;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(&bin)
            .arg(&dir)
            .args(&flags)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let control = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let event = match line.split("listening on ").nth(1) {
                    Some(addr) => addr.trim().to_owned(),
                    None if line.trim() == "killed" => "killed".to_owned(),
                    None => continue,
                };
                if tx.send(event).is_err() {
                    break;
                }
            }
        });
        let addr = rx
            .recv_timeout(START_TIMEOUT)
            .unwrap_or_else(|_| panic!("{} did not report a port", bin.display()));
        let port = addr
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {addr:?}"));
        OwnServer {
            uri: format!("mongodb://{addr}/?directConnection=true"),
            port,
            control: Mutex::new(control),
            events: Mutex::new(rx),
            _child: Mutex::new(child),
        }
    }

    /// Its connection string.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// `kill -9`, and wait until the process is gone.
    pub fn kill(&self) {
        self.send("kill");
        self.expect("killed");
    }

    /// Starts it again on the same port and storage, and waits until it
    /// listens.
    pub fn restart(&self) {
        self.send(&format!("start {}", self.port));
        let addr = self.next_event();
        assert!(
            addr.ends_with(&format!(":{}", self.port)),
            "restarted on {addr}"
        );
    }

    fn send(&self, line: &str) {
        let mut control = self.control.lock().unwrap();
        writeln!(control, "{line}").expect("the watchdog is gone");
        control.flush().expect("the watchdog is gone");
    }

    fn expect(&self, what: &str) {
        let got = self.next_event();
        assert_eq!(got, what, "test server: expected {what:?}");
    }

    fn next_event(&self) -> String {
        self.events
            .lock()
            .unwrap()
            .recv_timeout(START_TIMEOUT)
            .expect("the test server did not answer within 60 s")
    }
}

/// Whether the deployment behind `client` takes test commands
/// (`configureFailPoint`, as mongod does with `enableTestCommands=1`, and
/// an [`OwnServer`] with `test_commands`). Probes with a harmless
/// `configureFailPoint failCommand {mode: "off"}`. When the server refuses
/// it (a mongod without test commands, Atlas), prints
/// `SKIPPED <test>: server has no test commands (...)` to stderr and returns
/// false: the caller returns at once, so the test passes without having
/// checked anything, and says so. Any other failure (no server) panics.
pub async fn test_commands_or_skip(client: &Client, test: &str) -> bool {
    use mongo_patterns::mongodb::error::ErrorKind;
    let probe = mongo_patterns::bson::doc! {"configureFailPoint": "failCommand", "mode": "off"};
    match client.database("admin").run_command(probe).await {
        Ok(_) => true,
        Err(e) => match *e.kind {
            ErrorKind::Command(ref c) => {
                eprintln!(
                    "SKIPPED {test}: server has no test commands (configureFailPoint: {} {}: {})",
                    c.code, c.code_name, c.message
                );
                false
            }
            _ => panic!("{test}: cannot ask the server for test commands: {e}"),
        },
    }
}

/// Whether `client` talks to a `mongos` (a sharded cluster): `hello`
/// answers `msg: "isdbgrid"` there.
pub async fn is_mongos(client: &Client) -> bool {
    let hello = client
        .database("admin")
        .run_command(mongo_patterns::bson::doc! {"hello": 1})
        .await
        .expect("hello");
    hello.get_str("msg").ok() == Some("isdbgrid")
}

/// `hello`'s answer from the deployment behind `client` (the primary of a
/// replica set, or a `mongos`), within 30 s.
pub async fn hello(client: &Client) -> mongo_patterns::bson::Document {
    let hello = mongo_patterns::bson::doc! {"hello": 1};
    bounded(30, client.database("admin").run_command(hello))
        .await
        .expect("hello")
}

/// The `maxWireVersion` of MongoDB 8.0, the first release whose server
/// takes the `bulkWrite` command.
pub const BULK_WRITE_WIRE_VERSION: i32 = 25;

/// `hello.maxWireVersion` of the deployment behind `client`: 17 for
/// MongoDB 6.0, 21 for 7.0, 25 for 8.0 (the surrogate says 27).
pub async fn max_wire_version(client: &Client) -> i32 {
    use mongo_patterns::bson::Bson;
    let hello = hello(client).await;
    match hello.get("maxWireVersion") {
        Some(Bson::Int32(n)) => *n,
        Some(Bson::Int64(n)) => i32::try_from(*n).expect("a wire version"),
        _ => panic!("hello without maxWireVersion: {hello}"),
    }
}

/// Whether the deployment behind `client` takes 8.0's `bulkWrite` command
/// (`maxWireVersion` [`BULK_WRITE_WIRE_VERSION`] or more). MongoDB 6.0
/// does not know it (CommandNotFound, 59), 7.0 answers 40415 ("BSON field
/// 'bulkWrite.errorsOnly' is an unknown field"): the rank histogram learns
/// that from its first refusal and writes with `update` and `delete`
/// after it, so a test that counts the commands of `bulkWrite` writes
/// expects the fallback's where this is false. Says so on stderr, naming
/// `test`, when false.
pub async fn takes_bulk_write(client: &Client, test: &str) -> bool {
    let wire = max_wire_version(client).await;
    let takes = wire >= BULK_WRITE_WIRE_VERSION;
    if !takes {
        eprintln!(
            "{test}: the server (maxWireVersion {wire}) refuses bulkWrite: expecting the fallback's update and delete commands"
        );
    }
    takes
}

/// Set to `1` (the workflow's `mongos` job only), the pattern suites shard
/// their models' collections through `ensure` when a test makes its
/// database: see [`shard_declared`].
pub const SHARD_PATTERN_COLLECTIONS: &str = "MP_SHARD_PATTERN_COLLECTIONS";

/// Whether [`SHARD_PATTERN_COLLECTIONS`] is `1`.
pub fn shards_pattern_collections() -> bool {
    std::env::var(SHARD_PATTERN_COLLECTIONS).is_ok_and(|v| v == "1")
}

/// With `MP_SHARD_PATTERN_COLLECTIONS=1`: `ensure`s in `db` every
/// declaration of `declared` that has a shard key (a bucket's key, a rank
/// histogram's board, a counter's hashed `_id`, a `#[shard_key]`; the
/// others are left to the test), so that each such collection is sharded
/// before the test writes to it (on an empty collection `shardCollection`
/// builds the key's index itself), and panics unless `ensure` sharded
/// every one of them: the deployment is no `mongos`, or `ensure` reported
/// a conflict or a note that sharding did not apply. The commands it sent
/// are taken out of `commands`, so that a test counts its own. Without the
/// variable it does nothing.
pub async fn shard_declared(
    db: &Database,
    commands: &Commands,
    declared: impl IntoIterator<Item = mongo_patterns::ensure::Declared>,
) {
    use mongo_patterns::ensure::{EnsureAction, Note};
    let declared: Vec<_> = declared.into_iter().collect();
    validate_declared(db, commands, &declared).await;
    if !shards_pattern_collections() {
        return;
    }
    let keyed: Vec<_> = declared
        .into_iter()
        .filter(|d| d.shard_key.is_some())
        .collect();
    if keyed.is_empty() {
        return;
    }
    assert!(
        is_mongos(db.client()).await,
        "{SHARD_PATTERN_COLLECTIONS}=1, but the deployment is not a mongos (hello says no msg: \"isdbgrid\")"
    );
    let want: std::collections::BTreeSet<String> =
        keyed.iter().map(|d| d.collection.clone()).collect();
    let done = bounded(120, EnsureAction::new(db, keyed))
        .await
        .unwrap_or_else(|e| panic!("{SHARD_PATTERN_COLLECTIONS}: ensure in {}: {e}", db.name()));
    let unsharded = done.notes.iter().any(|n| {
        matches!(
            n,
            Note::ShardingNotApplicable { .. } | Note::ShardingUnknown { .. }
        )
    });
    let sharded: std::collections::BTreeSet<String> = done.sharded.iter().cloned().collect();
    assert!(
        done.conflicts.is_empty() && !unsharded && sharded == want,
        "{SHARD_PATTERN_COLLECTIONS}: ensure in {} sharded {sharded:?} of {want:?}:\n{done}",
        db.name()
    );
    commands.take();
}

/// The variable that sets every suite's collections' validators at
/// `strict` before a test writes: see [`validate_declared`].
pub const VALIDATE: &str = "MP_VALIDATE";

/// With `MP_VALIDATE=strict`: sets the validator of every declaration of
/// `declared` in `db` (`ensure` without the indexes), at `strict` whatever
/// the model chose, so that every write the test makes through the
/// repositories meets the server's check of the pattern's invariants, and
/// panics on a conflict.
/// [`shard_declared`] calls it: the suites that declare their models to
/// the routing checker run under validators too (`scripts/test` runs them
/// so once). The commands it sent are taken out of `commands`. Without the
/// variable it does nothing.
pub async fn validate_declared(
    db: &Database,
    commands: &Commands,
    declared: &[mongo_patterns::ensure::Declared],
) {
    match std::env::var(VALIDATE).as_deref() {
        Ok("strict") => {}
        Ok("") | Err(_) => return,
        Ok(other) => panic!("{VALIDATE}={other}: only \"strict\" is known"),
    }
    strict_validators(db, declared.iter().cloned()).await;
    commands.take();
}

/// A fresh database ([`fresh_db`]) with the validators of `declared`
/// (given the database) at `strict` ([`strict_validators`]), their
/// commands taken out of the record: what the fault suites start from.
pub async fn fresh_db_strict(
    test: &str,
    declared: impl FnOnce(&Database) -> Vec<mongo_patterns::ensure::Declared>,
) -> (Database, Commands) {
    let (db, commands) = fresh_db(test).await;
    strict_validators(&db, declared(&db)).await;
    commands.take();
    (db, commands)
}

/// Sets the validator of every declaration of `declared` in `db` at
/// `strict`, whatever the model chose (`ensure` without the indexes or
/// shard keys), and panics on a conflict: the fault suites call it on
/// every database their repositories write, so that no retry, repair or
/// replay of theirs stores what the pattern's invariants refuse.
pub async fn strict_validators(
    db: &Database,
    declared: impl IntoIterator<Item = mongo_patterns::ensure::Declared>,
) {
    use mongo_patterns::ensure::{with_validation, EnsureAction, Validation};
    // The validators alone: the indexes are the test's to create (the
    // test server refuses a hashed index on `_id`, which `mongod` builds).
    let mut strict = with_validation(declared.into_iter().collect(), Validation::Strict);
    for d in &mut strict {
        d.indexes.clear();
        d.shard_key = None;
    }
    let done = bounded(120, EnsureAction::new(db, strict))
        .await
        .unwrap_or_else(|e| panic!("strict validators in {}: {e}", db.name()));
    assert!(
        done.conflicts.is_empty(),
        "strict validators in {}:\n{done}",
        db.name()
    );
}

/// The `Conflict::Stored` entries of a plan's conflicts: what `plan` found
/// in the stored documents, as (collection, how many, the first `_id`s).
pub fn stored_conflicts(
    conflicts: &[mongo_patterns::ensure::Conflict],
) -> Vec<(String, u64, Vec<mongo_patterns::bson::Bson>)> {
    use mongo_patterns::ensure::Conflict;
    conflicts
        .iter()
        .filter_map(|c| match c {
            Conflict::Stored {
                collection,
                count,
                ids,
                ..
            } => Some((collection.clone(), *count, ids.clone())),
            _ => None,
        })
        .collect()
}

/// Sets the `failCommand` fail point (a server started with test
/// commands, as mongod with `enableTestCommands`): `data` for the next
/// `times` matching commands, or for every one until
/// [`fail_command_off`] when `None`.
pub async fn fail_command(c: &Client, times: Option<i32>, data: mongo_patterns::bson::Document) {
    use mongo_patterns::bson::{doc, Bson};
    let mode = match times {
        Some(n) => Bson::Document(doc! {"times": n}),
        None => Bson::String("alwaysOn".into()),
    };
    let set = doc! {"configureFailPoint": "failCommand", "mode": mode, "data": data};
    bounded(10, c.database("admin").run_command(set))
        .await
        .expect("configureFailPoint");
}

/// Turns the `failCommand` fail point off.
pub async fn fail_command_off(c: &Client) {
    let off = mongo_patterns::bson::doc! {"configureFailPoint": "failCommand", "mode": "off"};
    bounded(10, c.database("admin").run_command(off))
        .await
        .expect("configureFailPoint");
}

/// The longest a fault test waits for its turn at a shared deployment's
/// fail point ([`FaultServer`]).
const TURN_WAIT: Duration = Duration::from_secs(240);

/// A deployment for a test that sets fail points (`failCommand`):
/// `MONGODB_URI` when it takes test commands (`configureFailPoint`, as
/// mongod and mongos do with `enableTestCommands=1`), else a surrogate
/// server of the test's own ([`OwnServer`] with `test_commands`), as when
/// `MONGODB_URI` is unset.
///
/// `MONGODB_URI` is shared with every test running at the time, so there:
/// - [`uri`](Self::uri) names an `appName` of this test's own, and every
///   fail point set through [`fail`](Self::fail) is scoped to it: the
///   commands of other tests' clients are never failed;
/// - `failCommand` is one fail point per server, which the next setting
///   replaces: the fault tests take turns, each holding a listener on
///   127.0.0.1:28459 (one at a time, across the test processes nextest
///   runs and the threads of one) for as long as it holds its
///   `FaultServer` (started outside the test's own time bound: the wait
///   is at most 240 s);
/// - database names are made unique ([`db_name`](Self::db_name)), and
///   server-wide counts include other tests' work
///   ([`open_transactions`](Self::open_transactions) gives none).
///
/// Tests that kill and restart their server use [`OwnServer`] itself: a
/// URI cannot be killed from here.
pub struct FaultServer {
    uri: String,
    /// The `appName` of this test's clients, on a shared deployment.
    app: Option<String>,
    // Held for the life of the value: the surrogate, or the turn.
    _own: Option<OwnServer>,
    _turn: Option<std::net::TcpListener>,
}

impl FaultServer {
    /// `MONGODB_URI`, once it is this test's turn and if it takes test
    /// commands (the fail point is reset then: `mode: "off"`); otherwise a
    /// surrogate of the test's own, saying why on stderr when
    /// `MONGODB_URI` was set. `test` names the test in the `appName` and
    /// in messages.
    pub async fn start(test: &str) -> FaultServer {
        if let Some(uri) = std::env::var("MONGODB_URI").ok().filter(|u| !u.is_empty()) {
            let turn = take_turn(test).await;
            let app: String = format!("mp-{test}-{}-{}", std::process::id(), unique())
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
                .take(100)
                .collect();
            let uri = with_option(&uri, "appName", &app);
            let (c, _) = client(&uri).await;
            match takes_test_commands(&c, test).await {
                Ok(()) => {
                    return FaultServer {
                        uri,
                        app: Some(app),
                        _own: None,
                        _turn: Some(turn),
                    }
                }
                Err(refusal) => eprintln!(
                    "{test}: MONGODB_URI takes no test commands ({refusal}): a surrogate server of the test's own instead"
                ),
            }
        }
        let own = OwnServer::start(ServerOptions {
            test_commands: true,
            ..ServerOptions::default()
        });
        FaultServer {
            uri: own.uri().to_owned(),
            app: None,
            _own: Some(own),
            _turn: None,
        }
    }

    /// Its connection string (with this test's `appName` on a shared
    /// deployment).
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Whether it is `MONGODB_URI`, shared with other tests.
    pub fn is_shared(&self) -> bool {
        self.app.is_some()
    }

    /// A database name for `name`: `name` itself on a server of the test's
    /// own, a unique one (as [`fresh_db`]'s) on a shared deployment.
    pub fn db_name(&self, name: &str) -> String {
        if self.is_shared() {
            unique_db_name(name)
        } else {
            name.to_owned()
        }
    }

    /// Sets the `failCommand` fail point as [`fail_command`] does, scoped
    /// to this test's clients (`appName`) on a shared deployment.
    pub async fn fail(&self, c: &Client, times: Option<i32>, data: mongo_patterns::bson::Document) {
        let mut data = data;
        if let Some(app) = &self.app {
            data.insert("appName", app.as_str());
        }
        fail_command(c, times, data).await;
    }

    /// A connection string for a client of the test's that `failCommand`
    /// set through [`fail_only`](Self::fail_only) with the same `name`
    /// fails, and no other client: this test's `appName` (or, on a server
    /// of its own, one of its own) with `-name` appended.
    pub fn uri_named(&self, name: &str) -> String {
        match &self.app {
            Some(app) => self
                .uri
                .replace(&format!("appName={app}"), &format!("appName={app}-{name}")),
            None => with_option(&self.uri, "appName", &format!("mp-own-{name}")),
        }
    }

    /// [`fail`](Self::fail), for the commands of the clients of
    /// [`uri_named`](Self::uri_named)`(name)` only.
    pub async fn fail_only(
        &self,
        c: &Client,
        name: &str,
        times: Option<i32>,
        data: mongo_patterns::bson::Document,
    ) {
        let app = match &self.app {
            Some(app) => format!("{app}-{name}"),
            None => format!("mp-own-{name}"),
        };
        let mut data = data;
        data.insert("appName", app);
        fail_command(c, times, data).await;
    }

    /// Turns the `failCommand` fail point off.
    pub async fn off(&self, c: &Client) {
        fail_command_off(c).await;
    }

    /// The transactions open on the server now (`serverStatus`'s
    /// `transactions.currentOpen`), on a server of the test's own; `None`
    /// on a shared deployment, where the count includes other tests'
    /// transactions.
    pub async fn open_transactions(&self, c: &Client) -> Option<i64> {
        use mongo_patterns::bson::Bson;
        if self.is_shared() {
            return None;
        }
        let status = bounded(
            10,
            c.database("admin")
                .run_command(mongo_patterns::bson::doc! {"serverStatus": 1}),
        )
        .await
        .expect("serverStatus");
        let t = status.get_document("transactions").expect("transactions");
        Some(match t.get("currentOpen") {
            Some(Bson::Int32(n)) => i64::from(*n),
            Some(Bson::Int64(n)) => *n,
            other => panic!("currentOpen: {other:?}"),
        })
    }
}

/// The port on 127.0.0.1 whose listener is a shared deployment's fail
/// point turn ([`FaultServer`]): a port takes one listener at a time,
/// across processes and the threads of one, and the system frees it when
/// its holder exits, however it exits.
const TURN_PORT: u16 = 28459;

/// Waits (at most [`TURN_WAIT`]) for the fail point's turn, and returns
/// it held: the listener on [`TURN_PORT`].
async fn take_turn(test: &str) -> std::net::TcpListener {
    let start = std::time::Instant::now();
    loop {
        match std::net::TcpListener::bind(("127.0.0.1", TURN_PORT)) {
            Ok(turn) => return turn,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {}
            Err(e) => panic!(
                "{test}: cannot listen on 127.0.0.1:{TURN_PORT} for the fail point's turn: {e}"
            ),
        }
        assert!(
            start.elapsed() < TURN_WAIT,
            "{test}: 127.0.0.1:{TURN_PORT} (the fail point's turn: another fault test, or another program) stayed taken for {TURN_WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `Ok` when the deployment takes `configureFailPoint` (probed with
/// `failCommand` `mode: "off"`), the refusal otherwise; panics when it
/// cannot be asked at all.
async fn takes_test_commands(c: &Client, test: &str) -> Result<(), String> {
    use mongo_patterns::mongodb::error::ErrorKind;
    let probe = mongo_patterns::bson::doc! {"configureFailPoint": "failCommand", "mode": "off"};
    match bounded(30, c.database("admin").run_command(probe)).await {
        Ok(_) => Ok(()),
        Err(e) => match *e.kind {
            ErrorKind::Command(ref c) => Err(format!("{} {}: {}", c.code, c.code_name, c.message)),
            _ => panic!("{test}: cannot ask the server for test commands: {e}"),
        },
    }
}

/// Awaits `f` (a future, or an action) for at most `secs` seconds, and
/// panics past that: no test may hang on a call that should have returned.
pub async fn bounded<F: std::future::IntoFuture>(secs: u64, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(secs), f.into_future())
        .await
        .unwrap_or_else(|_| panic!("did not finish within {secs} s"))
}

/// Awaits `f` for at most `window`, to the microsecond: `None` if it was
/// cut. tokio's timers round a deadline up to the next millisecond, so a
/// `timeout` cannot cut a call that answers faster than that (a stage of
/// sub-millisecond writes once had 7 of 57 cut). The task yields in a loop
/// while it waits, letting the runtime poll its I/O in between.
pub async fn cut_after<F: std::future::IntoFuture>(window: Duration, f: F) -> Option<F::Output> {
    let deadline = std::time::Instant::now() + window;
    let wait = async {
        while std::time::Instant::now() < deadline {
            tokio::task::yield_now().await;
        }
    };
    tokio::select! {
        biased;
        v = f.into_future() => Some(v),
        () = wait => None,
    }
}

fn unique() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Counts the commands a client sends, by name: round trips, as the driver's
/// command monitoring sees them.
#[derive(Clone, Default)]
pub struct Commands {
    log: Arc<Mutex<Vec<(String, mongo_patterns::bson::Document)>>>,
    /// Commands that failed, as (name, error code name).
    failed: Arc<Mutex<Vec<(String, String)>>>,
    routing: Option<Routing>,
}

impl Commands {
    /// The routing checker watching this client's commands, if one is
    /// installed ([`client_with`], or `MP_ROUTING`: see [`routing`]).
    pub fn routing(&self) -> Option<&Routing> {
        self.routing.as_ref()
    }

    /// Everything sent since the last `take`, in order, as (name, command).
    pub fn take(&self) -> Vec<(String, mongo_patterns::bson::Document)> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }

    /// How many commands were sent since the last `take`, and forget them.
    pub fn take_count(&self) -> usize {
        self.take().len()
    }

    /// The commands that failed since the last `take_failed`, in order,
    /// as (name, the error's code name, or its message's start).
    pub fn take_failed(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.failed.lock().unwrap())
    }
}

/// `uri` with `maxPoolSize=n`, unless it sets a pool size already.
pub fn with_pool(uri: &str, n: u32) -> String {
    if uri.to_ascii_lowercase().contains("maxpoolsize") {
        return uri.to_owned();
    }
    if uri.contains('?') {
        return format!("{uri}&maxPoolSize={n}");
    }
    let after_scheme = uri.split_once("://").map_or(uri, |(_, rest)| rest);
    if after_scheme.contains('/') {
        format!("{uri}?maxPoolSize={n}")
    } else {
        format!("{uri}/?maxPoolSize={n}")
    }
}

/// `uri` with the option `key=value` added.
fn with_option(uri: &str, key: &str, value: &str) -> String {
    if uri.contains('?') {
        let sep = if uri.ends_with('?') || uri.ends_with('&') {
            ""
        } else {
            "&"
        };
        return format!("{uri}{sep}{key}={value}");
    }
    let after_scheme = uri.split_once("://").map_or(uri, |(_, rest)| rest);
    if after_scheme.contains('/') {
        format!("{uri}?{key}={value}")
    } else {
        format!("{uri}/?{key}={value}")
    }
}

/// A client for `uri` with command monitoring, waiting at most 10 s for the
/// server, so that a test never hangs on a dead one. With `MP_ROUTING` set,
/// the routing checker watches its commands ([`routing`]).
pub async fn client(uri: &str) -> (Client, Commands) {
    client_with(uri, Routing::from_env()).await
}

/// [`client`], with `routing` (when given) judging every command it sends,
/// through the same command monitoring hook that counts them.
pub async fn client_with(uri: &str, routing: Option<Routing>) -> (Client, Commands) {
    let mut opts = ClientOptions::parse(uri).await.expect("valid MONGODB_URI");
    opts.server_selection_timeout
        .get_or_insert(Duration::from_secs(10));
    opts.connect_timeout.get_or_insert(Duration::from_secs(10));
    let commands = Commands {
        log: Arc::default(),
        failed: Arc::default(),
        routing,
    };
    let log = commands.log.clone();
    let failed = commands.failed.clone();
    let routing = commands.routing.clone();
    opts.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| match ev {
        CommandEvent::Started(ev) => {
            if let Some(r) = &routing {
                r.observe(&ev.db, &ev.command_name, &ev.command);
            }
            log.lock().unwrap().push((ev.command_name, ev.command));
        }
        CommandEvent::Failed(ev) => {
            let why = match &*ev.failure.kind {
                mongo_patterns::mongodb::error::ErrorKind::Command(c) => c.code_name.clone(),
                other => other.to_string().chars().take(40).collect(),
            };
            failed.lock().unwrap().push((ev.command_name, why));
        }
        _ => {}
    }));
    (
        Client::with_options(opts).expect("client options"),
        commands,
    )
}

/// A database of its own for one test (so tests run in parallel), on the
/// shared server, with a command counter.
/// The most an operation's future may take: a boxed future up to this
/// size is served from glibc malloc's small-chunk lists; a larger one
/// first consolidates the small chunks the previous operation freed, which
/// makes the next operation's allocations slower (a sixth of a rank
/// `change`'s client instructions, measured).
pub const SMALL_FUTURE: usize = 1000;

/// The bytes `f` takes (for a boxed `dyn Future`, the future inside).
pub fn future_size<F: std::future::Future + ?Sized>(f: &F) -> usize {
    std::mem::size_of_val(f)
}

/// Fails with every entry of `sizes` (an operation and its future's size)
/// over [`SMALL_FUTURE`].
pub fn assert_small_futures(sizes: &[(&str, usize)]) {
    let large: Vec<_> = sizes.iter().filter(|(_, n)| *n > SMALL_FUTURE).collect();
    assert!(
        large.is_empty(),
        "futures over {SMALL_FUTURE} bytes: {large:?} (all: {sizes:?})"
    );
}

pub async fn fresh_db(test: &str) -> (Database, Commands) {
    fresh_db_with(test, Routing::from_env()).await
}

/// [`fresh_db`], with `routing` (when given) judging every command sent.
pub async fn fresh_db_with(test: &str, routing: Option<Routing>) -> (Database, Commands) {
    let uri = server_uri();
    let (client, commands) = client_with(&uri, routing).await;
    (client.database(&unique_db_name(test)), commands)
}

/// A database name of `test`'s own, unique in this process and across
/// processes: `mp_<test>_<pid>_<n>`, at most 63 characters.
fn unique_db_name(test: &str) -> String {
    format!("mp_{}_{}_{}", test, std::process::id(), unique())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect()
}

/// The `bson` calls that bson 3 renamed, for tests and benchmarks that run
/// with either version (the suite's `bson-3` feature picks it).
pub mod bsonc {
    use mongo_patterns::bson::{Bson, Regex};

    #[cfg(feature = "bson-3")]
    pub use mongo_patterns::bson::{
        deserialize_from_slice as from_slice, serialize_to_bson as to_bson,
        serialize_to_document as to_document, serialize_to_vec as to_vec,
    };
    #[cfg(not(feature = "bson-3"))]
    pub use mongo_patterns::bson::{from_slice, to_bson, to_document, to_vec};

    /// A regular expression value.
    pub fn regex(pattern: &str, options: &str) -> Bson {
        #[cfg(not(feature = "bson-3"))]
        let re = Regex {
            pattern: pattern.to_owned(),
            options: options.to_owned(),
        };
        #[cfg(feature = "bson-3")]
        let re = {
            use mongo_patterns::bson::raw::CString;
            let c = |s: &str| CString::try_from(s.to_owned()).expect("no NUL in a test's regex");
            Regex {
                pattern: c(pattern),
                options: c(options),
            }
        };
        Bson::RegularExpression(re)
    }

    /// Appends `value` under `key` (bson 3 keys are C strings).
    pub fn append(
        doc: &mut mongo_patterns::bson::RawDocumentBuf,
        key: &str,
        value: impl Into<mongo_patterns::bson::RawBson>,
    ) {
        #[cfg(not(feature = "bson-3"))]
        doc.append(key, value.into());
        #[cfg(feature = "bson-3")]
        doc.append(
            <&mongo_patterns::bson::raw::CStr>::try_from(key).expect("no NUL in a test's key"),
            value.into(),
        );
    }
}
