use mongo_patterns::approx_counter::Mode;
use mongo_patterns::prelude::*;
use mongo_patterns::rank_histogram::Layout;
use mongo_patterns::shard_key::{Coarse, Derived, Granularity, ShardSpec, TimeRepr};

// Attribute values that a `macro_rules!` macro passes on as `$x:literal`
// reach the derive wrapped in an invisible group; each pattern reads them
// as if written in place.
macro_rules! models {
    (
        $coll:literal, $rename:literal, $sort:literal, $sort2:literal, $page:literal,
        $size:literal, $key:literal, $order:literal,
        $board:literal, $score:literal, $asc:literal, $precision:literal, $layout:literal, $histogram:literal,
        $every:literal, $mode:literal, $upsert:literal,
        $coarse:literal, $from:literal, $granularity:literal, $search:literal, $hashed:literal
    ) => {
        #[derive(Serialize, Deserialize, Model)]
        #[model(collection = $coll)]
        #[keyset(sort = $sort, page_size = $page)]
        struct Visit {
            #[serde(rename = $rename)]
            at: DateTime,
            page: String,
        }

        #[derive(Serialize, Deserialize, Model)]
        #[keyset(sort = [$sort2, $sort], order = $asc)]
        struct Score {
            #[serde(rename = $rename)]
            at: DateTime,
            day: i32,
        }

        #[derive(Serialize, Deserialize, Model)]
        #[bucket(size = $size, key = $key, order = $order)]
        struct Trade {
            customer: i64,
            date: DateTime,
        }

        #[derive(Serialize, Deserialize, Model)]
        #[rank_histogram(board = $board, score = $score, order = $asc, precision = $precision, layout = $layout, histogram = $histogram)]
        struct Lap {
            track: String,
            time: f64,
        }

        #[derive(Serialize, Deserialize, Model)]
        struct Product {
            #[serde(rename = "_id")]
            id: String,
            #[approx_counter(every = $every, mode = $mode, upsert = $upsert)]
            views: i64,
        }

        #[derive(Serialize, Deserialize, Model)]
        #[shard_key(coarse = $coarse, from = $from, granularity = $granularity, search = $search)]
        struct Log {
            #[serde(rename = "_id")]
            id: ObjectId,
            kind: String,
            ts: i64,
        }

        #[derive(Serialize, Deserialize, Model)]
        #[shard_key(hashed = $hashed)]
        struct Session {
            #[serde(rename = "_id")]
            id: String,
        }
    };
}

models!(
    "visits",
    "when",
    "when",
    "day",
    50,
    500,
    "customer",
    "date",
    "track",
    "time",
    "asc",
    0.5,
    "array",
    "lap_ranks",
    10,
    "buffered",
    true,
    "month",
    "ts",
    "month",
    "kind",
    "_id"
);

fn main() {
    assert_eq!(Visit::COLLECTION, "visits");
    assert_eq!(Visit::KEYSET.sort, ["when"]);
    assert_eq!(Visit::KEYSET.page_size, 50);
    assert_eq!(Score::KEYSET.sort, ["day", "when"]);
    assert!(!Score::KEYSET.descending);

    let b = <Trade as Bucketed>::BUCKET;
    assert_eq!((b.size, b.key, b.order), (500, "customer", Some("date")));

    let r = <Lap as RankHistogram>::RANK;
    assert_eq!((r.board, r.score, r.descending), ("track", "time", false));
    assert_eq!((r.precision, r.layout), (Some(0.5), Layout::Array));
    assert_eq!(r.histogram, "lap_ranks");

    assert_eq!(
        <Log as ShardKeyed>::SHARD,
        ShardSpec::Ranged {
            coarse: Some(Coarse {
                field: "month",
                derived: Some(Derived {
                    from: "ts",
                    repr: TimeRepr::EpochSeconds,
                    granularity: Granularity::Month,
                }),
            }),
            search: Some("kind"),
        }
    );
    assert_eq!(<Session as ShardKeyed>::SHARD.hashed(), Some("_id"));

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // A client that never connects: handles only read their specs.
        let client = Client::with_uri_str("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100")
            .await
            .unwrap();
        let db = client.database("never_used");
        let s = Product::views_counter(&db).spec();
        assert_eq!((s.every, s.mode, s.upsert), (10, Mode::Buffered, true));
    });

    let v = Visit {
        at: DateTime::now(),
        page: String::new(),
    };
    let _ = (v.at, &v.page);
    let s = Score {
        at: DateTime::now(),
        day: 0,
    };
    let _ = (s.at, s.day);
    let t = Trade {
        customer: 0,
        date: DateTime::now(),
    };
    let _ = (t.customer, t.date);
    let l = Lap {
        track: String::new(),
        time: 0.0,
    };
    let _ = (&l.track, l.time);
    let p = Product {
        id: String::new(),
        views: 0,
    };
    let _ = (&p.id, p.views);
    let g = Log {
        id: ObjectId::new(),
        kind: String::new(),
        ts: 0,
    };
    let _ = (g.id, &g.kind, g.ts);
    let _ = Session { id: String::new() }.id;
}
