//! Command-line flags: `--name value` pairs and switches, numbers with `_`
//! separators, and a usage line on any mistake.

use std::str::FromStr;

/// A flag's numeric value; `_` separators are allowed (`100_000`). Calls
/// `usage` with an error when `s` is not a number.
pub fn num<T: FromStr>(s: &str, usage: fn(&str) -> !) -> T {
    s.replace('_', "")
        .parse()
        .unwrap_or_else(|_| usage(&format!("`{s}` is not a number")))
}

/// Prints `err` (unless empty) and `usage: {line}` to stderr, then exits:
/// with 0 when `err` is empty (`--help`), 2 otherwise.
pub fn usage(line: &str, err: &str) -> ! {
    if !err.is_empty() {
        eprintln!("error: {err}");
    }
    eprintln!("usage: {line}");
    std::process::exit(if err.is_empty() { 0 } else { 2 })
}

/// The program's arguments, read flag by flag:
///
/// ```no_run
/// # use mongo_patterns_testkit::bench::Flags;
/// let mut flags = Flags::from_env("keyset", "[--docs N] [--multi-thread]");
/// let (mut docs, mut multi_thread) = (200_000u64, false);
/// while let Some(flag) = flags.next_flag() {
///     match flag.as_str() {
///         "--docs" => docs = flags.value(&flag),
///         "--multi-thread" => multi_thread = true,
///         _ => flags.unknown(&flag),
///     }
/// }
/// ```
pub struct Flags {
    name: &'static str,
    line: String,
    args: std::vec::IntoIter<String>,
    given: Vec<String>,
}

impl Flags {
    /// The arguments of `cargo bench --bench {name} -- {synopsis}`.
    pub fn from_env(name: &'static str, synopsis: &str) -> Flags {
        Flags::new(name, synopsis, std::env::args().skip(1).collect())
    }

    fn new(name: &'static str, synopsis: &str, args: Vec<String>) -> Flags {
        // `cargo bench` passes `--bench` to harness-less benches.
        let given = args.iter().filter(|s| *s != "--bench").cloned().collect();
        Flags {
            name,
            line: format!("cargo bench --bench {name} -- {synopsis}"),
            args: args.into_iter(),
            given,
        }
    }

    /// The next flag, `None` after the last. `--help` (or `-h`) prints the
    /// usage line and exits.
    pub fn next_flag(&mut self) -> Option<String> {
        loop {
            let flag = self.args.next()?;
            match flag.as_str() {
                "--bench" => {}
                "-h" | "--help" => self.fail(""),
                _ => return Some(flag),
            }
        }
    }

    /// The value after `flag`, as given.
    pub fn string(&mut self, flag: &str) -> String {
        self.args
            .next()
            .unwrap_or_else(|| self.fail(&format!("{flag} needs a value")))
    }

    /// The value after `flag`, a number.
    pub fn value<T: FromStr>(&mut self, flag: &str) -> T {
        let s = self.string(flag);
        self.number(&s)
    }

    /// The value after `flag`, comma-separated numbers (empty items are
    /// skipped).
    pub fn list<T: FromStr>(&mut self, flag: &str) -> Vec<T> {
        let s = self.string(flag);
        s.split(',')
            .filter(|s| !s.is_empty())
            .map(|s| self.number(s))
            .collect()
    }

    fn number<T: FromStr>(&self, s: &str) -> T {
        s.replace('_', "")
            .parse()
            .unwrap_or_else(|_| self.fail(&format!("`{s}` is not a number")))
    }

    /// Ends the program on a flag it does not know.
    pub fn unknown(&self, flag: &str) -> ! {
        self.fail(&format!("unknown flag `{flag}`"))
    }

    /// Ends the program with `err` and the usage line ([`usage`]).
    pub fn fail(&self, err: &str) -> ! {
        usage(&self.line, err)
    }

    /// The command as run, for the report: `cargo bench --bench NAME`, with
    /// ` -- ` and the flags when some were given.
    pub fn command(&self) -> String {
        if self.given.is_empty() {
            format!("cargo bench --bench {}", self.name)
        } else {
            format!(
                "cargo bench --bench {} -- {}",
                self.name,
                self.given.join(" ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        Flags::new("t", "[--n N]", args.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn reads_flags_values_and_lists() {
        let mut f = flags(&["--bench", "--n", "100_000", "--on", "--l", "1,,2"]);
        assert_eq!(f.next_flag().as_deref(), Some("--n"));
        assert_eq!(f.value::<u64>("--n"), 100_000);
        assert_eq!(f.next_flag().as_deref(), Some("--on"));
        assert_eq!(f.next_flag().as_deref(), Some("--l"));
        assert_eq!(f.list::<u32>("--l"), vec![1, 2]);
        assert_eq!(f.next_flag(), None);
        assert_eq!(
            f.command(),
            "cargo bench --bench t -- --n 100_000 --on --l 1,,2"
        );
        assert_eq!(flags(&["--bench"]).command(), "cargo bench --bench t");
    }
}
