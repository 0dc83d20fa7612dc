//! Rank histogram: real-time exam ranks. Ten students score 50 50 50 60 60 60 60
//! 80 90 100; 85 ranks 3rd; a cheater's 100 is cleared to 0 without
//! rewriting anyone else's rank; then `--students N` more students (default
//! 10,000) with half-point scores show that the histogram holds at most 201
//! scores however many sit the exam; and class averages with two decimals
//! rank on a board of their own.
//!
//! `cargo run --example exam_rank -- --students 10000`, against MONGODB_URI
//! (or a server on localhost).

use mongo_patterns::prelude::*;

/// One student's score in one exam (the seed's other collection). The
/// board (`examId`) and the score are the only fields that can be them, so
/// `#[rank_histogram]` infers both; `precision` keeps half points exact.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "scores")]
#[rank_histogram(precision = 0.5)]
struct ExamScore {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: f64,
}

/// A class's average, rounded to two decimals; a board per term.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "class_averages")]
#[rank_histogram(board = "term", score = "average", precision = 0.01)]
struct ClassAverage {
    #[serde(rename = "_id")]
    class: String,
    term: String,
    average: f64,
}

#[tokio::main]
async fn main() -> mongo_patterns::Result<()> {
    let n: u32 = flag("--students").unwrap_or(10_000);
    let (client, commands) = connect().await?;
    let db = client.database("mp_example_exam_rank");
    db.drop().await?;
    let ranks = ExamScore::ranks(&db);
    ranks.ensure().await?;

    let seed = [50.0, 50.0, 50.0, 60.0, 60.0, 60.0, 60.0, 80.0, 90.0, 100.0];
    for (i, score) in seed.into_iter().enumerate() {
        ranks
            .insert(&ExamScore {
                student: format!("student{i}"),
                exam_id: "exam_001".into(),
                score,
            })
            .await?;
    }
    let doc = ranks
        .histogram_collection()
        .find_one(doc! {"_id": "exam_001"})
        .await?
        .unwrap_or_default();
    println!("the histogram document, as the seed draws it:\n  {doc}");

    commands.take();
    let r = ranks.rank("exam_001", 85.0).await?;
    println!(
        "85 ranks {} ({} above, {} students, {} round trip)",
        r.rank,
        r.above,
        r.total,
        commands.take_count()
    );
    for score in [100.0, 60.0, 50.0] {
        let r = ranks.rank("exam_001", score).await?;
        println!(
            "{score:>5}: rank {}, dense rank {}, {} tied, percentile {:.0}",
            r.rank,
            r.dense,
            r.ties,
            r.percentile().unwrap_or_default()
        );
    }

    // The seed's worst case for stored ranks: the top score is cleared.
    commands.take();
    ranks.update_score(doc! {"_id": "student9"}, 0.0).await?;
    println!(
        "student9 caught cheating, 100 → 0: {} commands (student, histogram, commit), no other student's document touched",
        commands.take_count()
    );
    let top: Vec<String> = ranks
        .top("exam_001", 3)
        .await?
        .iter()
        .map(|s| format!("#{} {}×{}", s.rank, s.score, s.count))
        .collect();
    println!("top 3 places now: {}", top.join(", "));

    // Many students, few scores.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let students: Vec<ExamScore> = (0..n)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ExamScore {
                student: format!("bulk{i}"),
                exam_id: "exam_002".into(),
                score: (state % 201) as f64 / 2.0,
            }
        })
        .collect();
    for chunk in students.chunks(10_000) {
        ExamScore::collection(&db).insert_many(chunk).await?;
    }
    let counted = ranks.rebuild("exam_002").await?;
    let h = ranks.histogram("exam_002").await?;
    println!(
        "exam_002: {counted} students, {} distinct scores in one histogram document; 75 ranks {}",
        h.len(),
        ranks.rank("exam_002", 75.0).await?.rank
    );

    // Class averages: two decimals, yet only as many scores as classes.
    let averages = ClassAverage::ranks(&db);
    for (class, avg) in [("1A", 81.237), ("1B", 79.5), ("1C", 81.2449), ("1D", 90.0)] {
        averages
            .insert(&ClassAverage {
                class: class.into(),
                term: "2026-autumn".into(),
                average: avg,
            })
            .await?;
    }
    let shown: Vec<String> = averages
        .histogram("2026-autumn")
        .await?
        .iter()
        .map(|s| format!("#{} {}", s.rank, s.score))
        .collect();
    println!(
        "class averages rounded to 0.01 (81.237 and 81.2449 tie at 81.24): {}",
        shown.join(", ")
    );
    db.drop().await?;
    Ok(())
}

fn flag(name: &str) -> Option<u32> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1)?.parse().ok()
}

/// The commands the client sent, from the driver's command monitoring:
/// what each call above costs.
#[derive(Clone, Default)]
struct Commands(std::sync::Arc<std::sync::Mutex<Vec<(String, Document)>>>);

impl Commands {
    /// The commands sent since the last take, oldest first.
    fn take(&self) -> Vec<(String, Document)> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// How many commands were sent since the last take.
    #[allow(dead_code)]
    fn take_count(&self) -> usize {
        self.take().len()
    }
}

/// A client for `MONGODB_URI` (`mongodb://localhost:27017` when unset;
/// Atlas gives `mongodb+srv://user:pass@cluster0.example.mongodb.net`)
/// that counts the commands it sends.
async fn connect() -> mongo_patterns::Result<(Client, Commands)> {
    use mongo_patterns::mongodb::event::{command::CommandEvent, EventHandler};
    let uri = std::env::var("MONGODB_URI").unwrap_or_else(|_| "mongodb://localhost:27017".into());
    let mut options = mongo_patterns::mongodb::options::ClientOptions::parse(&uri).await?;
    let commands = Commands::default();
    let log = commands.0.clone();
    options.command_event_handler = Some(EventHandler::callback(move |e: CommandEvent| {
        if let CommandEvent::Started(e) = e {
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            log.push((e.command_name, e.command));
        }
    }));
    Ok((Client::with_options(options)?, commands))
}
