//! Elections against a real `leaseholdd` process: campaign, proclaim,
//! resign, and an observer that sees every change in order.

use std::time::Duration;

use futures::StreamExt;
use leasehold::{Client, Leader, LockOptions};
use leasehold_testkit::Leaseholdd;

fn opts() -> LockOptions {
    LockOptions::default()
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(20))
}

async fn client(server: &Leaseholdd, name: &str) -> Client {
    Client::builder(&server.url())
        .holder(name)
        .connect()
        .await
        .expect("connect")
}

fn value(leader: &Option<Leader>) -> Option<String> {
    leader
        .as_ref()
        .map(|l| String::from_utf8_lossy(&l.value).into_owned())
}

#[tokio::test]
async fn observe_sees_every_leader_and_every_proclaimed_value_in_order() {
    let server = Leaseholdd::start();
    let watcher = client(&server, "watcher").await;
    let election = watcher.election("scheduler");
    let mut seen = election.observe().await.expect("observe");
    assert_eq!(seen.next().await.expect("first").expect("ok"), None);

    let a = client(&server, "a").await;
    let b = client(&server, "b").await;
    let lead_a = a
        .election("scheduler")
        .campaign("a:1", opts())
        .await
        .expect("a leads");
    // b waits in line behind a.
    let b_campaign = tokio::spawn(async move {
        let leadership = b
            .election("scheduler")
            .campaign("b:1", opts())
            .await
            .expect("b leads");
        (b, leadership)
    });
    lead_a.proclaim("a:2").await.expect("proclaim");
    assert_eq!(
        election.leader().await.expect("leader").map(|l| l.value),
        Some(b"a:2".to_vec())
    );
    let token_a = lead_a.token().expect("live");
    lead_a.resign().await.expect("resign");
    let (_b, lead_b) = b_campaign.await.expect("b");
    assert!(
        lead_b.token().expect("live") > token_a,
        "a later leader has a higher token"
    );
    lead_b.resign().await.expect("resign");

    let mut changes = Vec::new();
    while changes.len() < 5 {
        let next = tokio::time::timeout(Duration::from_secs(10), seen.next())
            .await
            .expect("a change in time")
            .expect("stream open")
            .expect("ok");
        changes.push(value(&next));
    }
    let expected = [Some("a:1"), Some("a:2"), None, Some("b:1"), None];
    let changes: Vec<Option<&str>> = changes.iter().map(|c| c.as_deref()).collect();
    assert_eq!(&changes[..], &expected[..], "{changes:?}");
}

#[tokio::test]
async fn a_leader_whose_client_goes_away_is_observed_gone() {
    let server = Leaseholdd::start();
    let watcher = client(&server, "watcher").await;
    let a = client(&server, "a").await;
    let lead_a = a
        .election("jobs")
        .campaign("a", opts().ttl(Duration::from_millis(600)))
        .await
        .expect("a leads");
    let mut seen = watcher.election("jobs").observe().await.expect("observe");
    assert_eq!(
        value(&seen.next().await.expect("first").expect("ok")).as_deref(),
        Some("a")
    );
    // a's client shuts down: its session ends, and with it the leadership.
    std::mem::forget(lead_a);
    a.close().await;
    let next = tokio::time::timeout(Duration::from_secs(10), seen.next())
        .await
        .expect("in time")
        .expect("open")
        .expect("ok");
    assert_eq!(next, None, "the dead leader is observed gone");
}
