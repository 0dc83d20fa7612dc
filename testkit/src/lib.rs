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

/// Awaits `f` (a future, or an action) for at most `secs` seconds, and
/// panics past that: no test may hang on a call that should have returned.
pub async fn bounded<F: std::future::IntoFuture>(secs: u64, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(secs), f.into_future())
        .await
        .unwrap_or_else(|_| panic!("did not finish within {secs} s"))
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
        routing,
    };
    let log = commands.log.clone();
    let routing = commands.routing.clone();
    opts.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| {
        if let CommandEvent::Started(ev) = ev {
            if let Some(r) = &routing {
                r.observe(&ev.db, &ev.command_name, &ev.command);
            }
            log.lock().unwrap().push((ev.command_name, ev.command));
        }
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
    let name: String = format!("mp_{}_{}_{}", test, std::process::id(), unique())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect();
    (client.database(&name), commands)
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
