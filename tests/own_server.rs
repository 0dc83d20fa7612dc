//! The test kit's own servers: killed with `kill -9` and started again in
//! place, they keep what they acknowledged (with `sync_on_commit`), and the
//! same client resumes.

use std::time::Duration;

use mongo_patterns::bson::{doc, Document};
use mongo_patterns::Error;
use mongo_patterns_testkit::{client, OwnServer, ServerOptions};

#[tokio::test]
async fn a_killed_server_restarts_in_place_with_its_data() {
    let server = OwnServer::start(ServerOptions {
        sync_on_commit: true,
        ..ServerOptions::default()
    });
    let (client, _) = client(server.uri()).await;
    let coll = client.database("own").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 1, "n": 1}).await.unwrap();

    server.kill();
    let down = tokio::time::timeout(Duration::from_secs(30), coll.find_one(doc! {})).await;
    let err = Error::from(down.expect("bounded by server selection").unwrap_err());
    assert!(err.is_unavailable(), "{err:?}");

    server.restart();
    let back = coll.find_one(doc! {"_id": 1}).await.unwrap();
    assert_eq!(back, Some(doc! {"_id": 1, "n": 1}));
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 2);
}

/// `test_commands_or_skip` tells a server with test commands from one
/// without (which refuses `configureFailPoint`, as a mongod without
/// `enableTestCommands` or Atlas does): a fail-point test then skips,
/// saying so, instead of failing.
#[tokio::test]
async fn test_commands_are_detected() {
    use mongo_patterns_testkit::test_commands_or_skip;
    for test_commands in [true, false] {
        let server = OwnServer::start(ServerOptions {
            test_commands,
            ..ServerOptions::default()
        });
        let (client, _) = client(server.uri()).await;
        assert_eq!(
            test_commands_or_skip(&client, "test_commands_are_detected").await,
            test_commands
        );
    }
}
