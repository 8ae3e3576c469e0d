//! The master's move driver (`basalt_operator::master::moves`) against a real etcd (Debian's
//! `/usr/bin/etcd`) holding the cluster's tablet map and the master's term, with the two
//! tablet servers played by a fake `TabletControl` that answers, fails, hangs or leaves the
//! outcome unknown at a chosen step. Between the driver and etcd a TCP proxy can lose etcd's
//! answer to a transaction (etcd wrote it; the driver cannot know) or the request itself.
//!
//! Each test says what an operator would see afterwards: the move's outcome and reason, the
//! tablet's owner, epoch and state in etcd, the move's record gone, and what the servers
//! were asked. The order of the steps alone is unit-tested in `basalt_master::moves`.

mod etcd;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use basalt_master::model::{RowRange, TableSchema, Tablet, TabletState};
use basalt_master::{
    Fence, MoveSpec, Received, ServerReport, ServerState, StepError, TabletControl,
};
use basalt_meta::{Keys, Leadership, Meta, MoveRecord, Term};
use basalt_operator::master::moves::{
    self, BACKSTOP, Deadlines, Move, Outcome, abort_leftovers, run_with,
};
use bytes::Bytes;
use etcd::{Endpoints, Etcd};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CLUSTER: &str = "c1";
const TABLE: &str = "projects/p/instances/inst/tables/t";
const SOURCE: &str = "st-src";
const DESTINATION: &str = "st-dst";
/// The servers' addresses, as the fake sees them.
const SOURCE_ADDRESS: &str = "source:8086";
const DESTINATION_ADDRESS: &str = "destination:8086";

/// Short deadlines, so that a hang costs a second or two.
const DEADLINES: Deadlines = Deadlines {
    receive: Duration::from_millis(1500),
    step: Duration::from_millis(500),
};

/// What the fake source answers to FenceTablet; FinishMove must pass it on.
const FENCE: Fence = Fence {
    seq: 42,
    clock: 1_700_000_000_000_007,
};
const RECEIVED: Received = Received {
    bytes: 123_456,
    copy_seconds: 0.25,
};

// ------------------------------------------------------------------------------- the fake

/// A server's step of a move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Call {
    Receive,
    Fence,
    Finish,
    Release,
    Abort,
}

/// What the fake does when called.
#[derive(Clone, Copy, Debug)]
enum Act {
    /// Does it and answers.
    Answer,
    /// Answers that it did not do it.
    Fail,
    /// Leaves the outcome unknown (as a broken connection or a deadline would).
    Unknown,
    /// Never answers.
    Hang,
}

type Hook = Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// Both tablet servers of the move, by address: every call is recorded; each step answers,
/// fails, leaves its outcome unknown or hangs as told, after running its hook (to change
/// the world while the step runs).
#[derive(Default)]
struct Fake {
    acts: HashMap<Call, Act>,
    hooks: HashMap<Call, Hook>,
    calls: Mutex<Vec<String>>,
    /// The move ids the calls named.
    ids: Mutex<Vec<String>>,
}

impl Fake {
    fn new() -> Fake {
        Fake::default()
    }

    fn act(mut self, call: Call, act: Act) -> Fake {
        self.acts.insert(call, act);
        self
    }

    fn on<F>(mut self, call: Call, hook: F) -> Fake
    where
        F: Fn() -> BoxFuture<'static, ()> + Send + Sync + 'static,
    {
        self.hooks.insert(call, Box::new(hook));
        self
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().clone()
    }

    async fn step<T>(
        &self,
        call: Call,
        what: String,
        spec: &MoveSpec,
        answer: T,
    ) -> Result<T, StepError> {
        self.calls.lock().push(what);
        self.ids.lock().push(spec.id.clone());
        assert_eq!(spec.table_name, TABLE);
        assert_eq!(
            spec.tablet,
            planned(),
            "the spec names the tablet as planned"
        );
        if let Some(hook) = self.hooks.get(&call) {
            hook().await;
        }
        match self.acts.get(&call).copied().unwrap_or(Act::Answer) {
            Act::Answer => Ok(answer),
            Act::Fail => Err(StepError::Failed(format!("{call:?} refused"))),
            Act::Unknown => Err(StepError::Unknown(format!("{call:?} connection reset"))),
            Act::Hang => std::future::pending().await,
        }
    }
}

fn server(address: &str) -> &'static str {
    match address {
        SOURCE_ADDRESS => "source",
        DESTINATION_ADDRESS => "destination",
        other => panic!("a call to an unknown server {other}"),
    }
}

impl TabletControl for Fake {
    type Error = std::io::Error;

    async fn report(&self, _: &ServerState) -> Result<ServerReport, std::io::Error> {
        unimplemented!("the move driver asks for no report")
    }

    async fn split_point(
        &self,
        _: &ServerState,
        _: &str,
        _: &Tablet,
    ) -> Result<Option<Bytes>, std::io::Error> {
        unimplemented!("the move driver asks for no split point")
    }

    async fn receive_tablet(
        &self,
        to: &str,
        spec: &MoveSpec,
        source: &str,
        rate_limit_bytes_per_sec: u64,
        deadline: Duration,
    ) -> Result<Received, StepError> {
        assert_eq!(
            (source, rate_limit_bytes_per_sec),
            (SOURCE_ADDRESS, 1 << 20)
        );
        assert_eq!(deadline, DEADLINES.receive);
        let what = format!("ReceiveTablet {} from {}", server(to), server(source));
        self.step(Call::Receive, what, spec, RECEIVED).await
    }

    async fn fence_tablet(
        &self,
        from: &str,
        spec: &MoveSpec,
        deadline: Duration,
    ) -> Result<Fence, StepError> {
        assert_eq!(deadline, DEADLINES.step);
        let what = format!("FenceTablet {}", server(from));
        self.step(Call::Fence, what, spec, FENCE).await
    }

    async fn finish_move(
        &self,
        to: &str,
        spec: &MoveSpec,
        fence: Fence,
        deadline: Duration,
    ) -> Result<(), StepError> {
        assert_eq!(deadline, DEADLINES.step);
        let what = format!(
            "FinishMove {} through {} at clock {}",
            server(to),
            fence.seq,
            fence.clock
        );
        self.step(Call::Finish, what, spec, ()).await
    }

    async fn release_tablet(
        &self,
        from: &str,
        spec: &MoveSpec,
        deadline: Duration,
    ) -> Result<(), StepError> {
        assert_eq!(deadline, DEADLINES.step);
        let what = format!("ReleaseTablet {}", server(from));
        self.step(Call::Release, what, spec, ()).await
    }

    async fn abort_move(
        &self,
        at: &str,
        spec: &MoveSpec,
        deadline: Duration,
    ) -> Result<(), StepError> {
        assert_eq!(deadline, DEADLINES.step);
        let what = format!("AbortMove {}", server(at));
        self.step(Call::Abort, what, spec, ()).await
    }
}

/// The calls of a move that committed: the copy, the fence, the finish with the fence's
/// sequence and clock, the release.
fn committed_calls() -> Vec<String> {
    vec![
        "ReceiveTablet destination from source".into(),
        "FenceTablet source".into(),
        format!(
            "FinishMove destination through {} at clock {}",
            FENCE.seq, FENCE.clock
        ),
        "ReleaseTablet source".into(),
    ]
}

/// The calls after an abort that won: both servers told, the source first; never a release.
fn told_abort() -> [String; 2] {
    ["AbortMove source".into(), "AbortMove destination".into()]
}

fn calls(calls: &[&str]) -> Vec<String> {
    calls.iter().map(|c| c.to_string()).collect()
}

// ------------------------------------------------------------------------------ the proxy

/// What the proxy loses until it breaks the connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lose {
    /// etcd's answers: a transaction sent now is written, and the driver never hears so.
    Answers,
    /// The driver's requests: a transaction sent now never reaches etcd.
    Requests,
}

/// A TCP proxy between the driver and etcd.
struct Proxy {
    address: SocketAddr,
    losing: Arc<Mutex<Option<Lose>>>,
    cut: Arc<tokio::sync::watch::Sender<u64>>,
}

/// How long the proxy loses traffic before it breaks the connections (the driver's call in
/// flight then fails at once, well before etcd's request timeout).
const LOSS: Duration = Duration::from_millis(300);

impl Proxy {
    async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy {
            address: listener.local_addr().unwrap(),
            losing: Arc::new(Mutex::new(None)),
            cut: Arc::new(tokio::sync::watch::channel(0).0),
        };
        let (losing, cut) = (proxy.losing.clone(), proxy.cut.clone());
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(etcd) = TcpStream::connect(target).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (etcd_read, etcd_write) = etcd.into_split();
                let losing = losing.clone();
                let (mut cut1, mut cut2) = (cut.subscribe(), cut.subscribe());
                let l1 = losing.clone();
                tokio::spawn(async move {
                    pump(client_read, etcd_write, &mut cut1, || {
                        *l1.lock() == Some(Lose::Requests)
                    })
                    .await
                });
                tokio::spawn(async move {
                    pump(etcd_read, client_write, &mut cut2, || {
                        losing.lock().is_some()
                    })
                    .await
                });
            }
        });
        proxy
    }

    fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// From now on loses `what` (and, losing requests, their answers too); [`LOSS`] later
    /// breaks every connection and passes everything again on new ones.
    fn lose(&self, what: Lose) {
        *self.losing.lock() = Some(what);
        let (losing, cut) = (self.losing.clone(), self.cut.clone());
        tokio::spawn(async move {
            tokio::time::sleep(LOSS).await;
            cut.send_modify(|generation| *generation += 1);
            *losing.lock() = None;
        });
    }
}

/// Copies `from` to `to` until either closes or the connections are cut; drops what
/// `losing()` says to.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: &mut tokio::sync::watch::Receiver<u64>,
    losing: impl Fn() -> bool,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if !losing() && to.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            },
            _ = cut.changed() => return,
        }
    }
}

// ---------------------------------------------------------------------------- the world

/// The tablet the moves are about, as planned: `["", "m")` of table t, owned by the source at
/// epoch 1, serving.
fn planned() -> Tablet {
    Tablet {
        table: "t".into(),
        range: RowRange::new(Bytes::new(), Some(Bytes::from_static(b"m"))),
        epoch: 1,
        owner: SOURCE.into(),
        state: TabletState::Serving,
    }
}

/// The same tablet once moved: the destination's, at epoch 2, serving.
fn moved() -> Tablet {
    Tablet {
        epoch: 2,
        owner: DESTINATION.into(),
        ..planned()
    }
}

fn schema() -> TableSchema {
    TableSchema {
        id: 0,
        name: TABLE.into(),
        families: Default::default(),
        dropped_families: Default::default(),
        deletion_protection: false,
        splits: vec![b"m".to_vec()],
        created_micros: 0,
        restore: None,
    }
}

/// etcd with table t's two tablets in cluster c1 (`["", "m")` on the source, `["m", …)` on
/// the destination) and a master's term; the driver reaches etcd through a [`Proxy`].
struct World {
    _etcd: Etcd,
    /// Straight to etcd: what an operator reads.
    meta: Meta,
    /// Through the proxy: the driver's.
    driver: Meta,
    proxy: Proxy,
    leadership: Mutex<Option<Leadership>>,
    term: Term,
}

impl World {
    async fn start() -> Arc<World> {
        let etcd = Etcd::start().await;
        let keys = Keys::new("ns", "inst");
        let meta = Meta::connect(&etcd.endpoints(), keys.clone())
            .await
            .unwrap();
        let stored = meta.create_table(schema()).await.unwrap();
        let leadership = meta
            .campaign("master-a", Duration::from_secs(10))
            .await
            .unwrap();
        let term = leadership.term.clone();
        let other = Tablet {
            range: RowRange::new(Bytes::from_static(b"m"), None),
            owner: DESTINATION.into(),
            ..planned()
        };
        assert!(
            meta.assign_table(
                &term,
                CLUSTER,
                "t",
                stored.create_revision,
                &[planned(), other]
            )
            .await
            .unwrap()
        );
        let target = SocketAddr::from(([127, 0, 0, 1], etcd.port()));
        let proxy = Proxy::start(target).await;
        let endpoints = basalt_meta::EtcdEndpoints::plaintext(&[proxy.url()]).unwrap();
        let driver = Meta::connect(&endpoints, keys).await.unwrap();
        Arc::new(World {
            _etcd: etcd,
            meta,
            driver,
            proxy,
            leadership: Mutex::new(Some(leadership)),
            term,
        })
    }

    fn plan(&self) -> Move {
        Move {
            cluster: CLUSTER.into(),
            table_name: TABLE.into(),
            tablet: planned(),
            to: DESTINATION.into(),
            from_address: SOURCE_ADDRESS.into(),
            to_address: DESTINATION_ADDRESS.into(),
            reason: "balance".into(),
            rate_limit_bytes_per_sec: 1 << 20,
        }
    }

    /// Runs the move with `fake` for servers; also checks that every call named the move
    /// whose record etcd had.
    async fn run(&self, fake: &Fake) -> Outcome {
        let outcome = run_with(&self.driver, &self.term, fake, &self.plan(), DEADLINES).await;
        let ids = fake.ids.lock().clone();
        assert!(
            ids.windows(2).all(|w| w[0] == w[1]),
            "every call names the same move: {ids:?}"
        );
        outcome
    }

    /// The tablet `["", "m")` as etcd has it now.
    async fn tablet(&self) -> Tablet {
        let (map, _) = self.meta.tablets(CLUSTER).await.unwrap();
        map.tablets("t")
            .iter()
            .find(|t| t.range == planned().range)
            .cloned()
            .expect("the tablet is in the map")
    }

    async fn moves(&self) -> Vec<MoveRecord> {
        self.meta.moves(CLUSTER).await.unwrap()
    }

    /// The tablet is still the source's, serving, at the same epoch; no move is recorded.
    async fn assert_stayed(&self) {
        assert_eq!(self.tablet().await, planned());
        assert_eq!(self.moves().await, []);
    }

    /// The tablet is the destination's at epoch + 1, serving; no move is recorded.
    async fn assert_moved(&self) {
        assert_eq!(self.tablet().await, moved());
        assert_eq!(self.moves().await, []);
    }

    /// Another master takes over (this one resigns) and, as every new term begins, aborts
    /// the moves it finds.
    async fn take_over(&self) {
        let leadership = self.leadership.lock().take().expect("still leading");
        leadership.resign().await;
        let next = self
            .meta
            .campaign("master-b", Duration::from_secs(10))
            .await
            .unwrap();
        assert_ne!(next.term, self.term);
        abort_leftovers(&self.meta, &next.term, CLUSTER)
            .await
            .unwrap();
        *self.leadership.lock() = Some(next);
    }
}

fn aborted(outcome: &Outcome) -> &str {
    match outcome {
        Outcome::Aborted(why) => why,
        Outcome::Moved(_) => panic!("the move committed; expected it aborted"),
    }
}

fn assert_moved_with_stats(outcome: &Outcome) {
    let Outcome::Moved(stats) = outcome else {
        panic!("expected the move committed: {outcome:?}");
    };
    assert_eq!(stats.bytes, RECEIVED.bytes);
    assert_eq!(stats.copy_seconds, RECEIVED.copy_seconds);
    assert!(stats.fenced_seconds <= stats.seconds);
}

// ---------------------------------------------------------------------------- the tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_commits_then_the_source_releases() {
    let world = World::start().await;
    let fake = Fake::new();
    let outcome = world.run(&fake).await;
    assert_moved_with_stats(&outcome);
    world.assert_moved().await;
    assert_eq!(fake.calls(), committed_calls());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_copy_aborts_and_both_servers_are_told() {
    let world = World::start().await;
    let fake = Fake::new().act(Call::Receive, Act::Fail);
    let outcome = world.run(&fake).await;
    assert_eq!(
        aborted(&outcome),
        "the destination could not copy the tablet: Receive refused"
    );
    world.assert_stayed().await;
    let mut expected = calls(&["ReceiveTablet destination from source"]);
    expected.extend(told_abort());
    assert_eq!(fake.calls(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_never_answers_aborts_past_its_deadline() {
    let world = World::start().await;
    let fake = Fake::new().act(Call::Receive, Act::Hang);
    let started = Instant::now();
    let outcome = world.run(&fake).await;
    let took = started.elapsed();
    assert!(took >= DEADLINES.receive, "gave up after {took:?}");
    assert!(
        took < DEADLINES.receive + BACKSTOP + Duration::from_secs(3),
        "took {took:?}"
    );
    assert_eq!(
        aborted(&outcome),
        format!(
            "the destination could not copy the tablet: no answer within {:?} (outcome unknown)",
            DEADLINES.receive
        )
    );
    world.assert_stayed().await;
    let mut expected = calls(&["ReceiveTablet destination from source"]);
    expected.extend(told_abort());
    assert_eq!(fake.calls(), expected);
}

/// The source's fence fails, is unknown, or never answers: the tablet, fenced in etcd, goes
/// back to serving at the source at the same epoch, and the source is told to unfence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fence_puts_the_tablet_back_to_serving_at_the_source() {
    for (act, why) in [
        (Act::Fail, "Fence refused".to_string()),
        (
            Act::Unknown,
            "Fence connection reset (outcome unknown)".to_string(),
        ),
        (
            Act::Hang,
            format!("no answer within {:?} (outcome unknown)", DEADLINES.step),
        ),
    ] {
        let world = World::start().await;
        // While the source fences, etcd says Fencing: nobody serves the tablet.
        let w = world.clone();
        let fake = Fake::new().act(Call::Fence, act).on(Call::Fence, move || {
            let w = w.clone();
            Box::pin(async move {
                let t = w.tablet().await;
                assert_eq!(
                    (t.owner.as_str(), t.epoch, t.state),
                    (SOURCE, 1, TabletState::Fencing)
                );
            })
        });
        let outcome = world.run(&fake).await;
        assert_eq!(
            aborted(&outcome),
            format!("the source could not fence the tablet: {why}"),
            "{act:?}"
        );
        world.assert_stayed().await;
        let mut expected = calls(&[
            "ReceiveTablet destination from source",
            "FenceTablet source",
        ]);
        expected.extend(told_abort());
        assert_eq!(fake.calls(), expected, "{act:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_finish_aborts_and_the_source_unfences() {
    for (act, why) in [
        (Act::Fail, "Finish refused".to_string()),
        (
            Act::Hang,
            format!("no answer within {:?} (outcome unknown)", DEADLINES.step),
        ),
    ] {
        let world = World::start().await;
        let fake = Fake::new().act(Call::Finish, act);
        let outcome = world.run(&fake).await;
        assert_eq!(
            aborted(&outcome),
            format!("the destination could not finish: {why}"),
            "{act:?}"
        );
        world.assert_stayed().await;
        let mut expected = committed_calls();
        expected.truncate(3);
        expected.extend(told_abort());
        assert_eq!(fake.calls(), expected, "{act:?}");
    }
}

/// Once the commit is written the tablet has moved: a release that fails or never answers
/// changes nothing (the source releases on its own when it sees the new owner).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_release_does_not_undo_the_commit() {
    for act in [Act::Fail, Act::Hang] {
        let world = World::start().await;
        let fake = Fake::new().act(Call::Release, act);
        let started = Instant::now();
        let outcome = world.run(&fake).await;
        assert!(started.elapsed() < DEADLINES.step + BACKSTOP + Duration::from_secs(3));
        assert_moved_with_stats(&outcome);
        world.assert_moved().await;
        assert_eq!(fake.calls(), committed_calls(), "{act:?}");
    }
}

/// AbortMove failing or hanging at the source does not keep the destination from being told,
/// and the abort stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_abort_call_changes_nothing() {
    for act in [Act::Fail, Act::Hang] {
        let world = World::start().await;
        let fake = Fake::new()
            .act(Call::Receive, Act::Fail)
            .act(Call::Abort, act);
        let outcome = world.run(&fake).await;
        assert_eq!(
            aborted(&outcome),
            "the destination could not copy the tablet: Receive refused"
        );
        world.assert_stayed().await;
        let mut expected = calls(&["ReceiveTablet destination from source"]);
        expected.extend(told_abort());
        assert_eq!(fake.calls(), expected, "{act:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tablet_that_changed_before_the_move_is_not_moved() {
    let world = World::start().await;
    // The tablet's owner was declared lost after the plan was made.
    let lost = Tablet {
        state: TabletState::Lost,
        ..planned()
    };
    assert!(
        world
            .meta
            .change_tablet(&world.term, CLUSTER, &planned(), &lost)
            .await
            .unwrap()
    );
    let fake = Fake::new();
    let outcome = world.run(&fake).await;
    assert_eq!(
        aborted(&outcome),
        "the tablet changed before the move began"
    );
    assert_eq!(world.tablet().await, lost);
    assert_eq!(world.moves().await, []);
    assert_eq!(
        fake.calls(),
        Vec::<String>::new(),
        "no server was asked anything"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tablet_that_changed_during_the_copy_is_not_fenced() {
    let world = World::start().await;
    let lost = Tablet {
        state: TabletState::Lost,
        ..planned()
    };
    // While the destination copies, the source is declared lost.
    let w = world.clone();
    let fake = Fake::new().on(Call::Receive, move || {
        let (w, lost) = (w.clone(), lost.clone());
        Box::pin(async move {
            assert!(
                w.meta
                    .change_tablet(&w.term, CLUSTER, &planned(), &lost)
                    .await
                    .unwrap()
            );
        })
    });
    let outcome = world.run(&fake).await;
    assert_eq!(
        aborted(&outcome),
        "the tablet or the move changed before the fence"
    );
    // The abort deleted the record and left the tablet as the other change made it.
    assert_eq!(
        world.tablet().await,
        Tablet {
            state: TabletState::Lost,
            ..planned()
        }
    );
    assert_eq!(world.moves().await, []);
    let mut expected = calls(&["ReceiveTablet destination from source"]);
    expected.extend(told_abort());
    assert_eq!(fake.calls(), expected);
}

/// Another master takes over while the destination finishes and aborts the move it finds:
/// this driver's commit is refused (its term ended), and it tells the servers nothing — they
/// end their parts when they see the record gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_another_master_aborted_does_not_commit() {
    let world = World::start().await;
    let w = world.clone();
    let fake = Fake::new().on(Call::Finish, move || {
        let w = w.clone();
        Box::pin(async move { w.take_over().await })
    });
    let outcome = world.run(&fake).await;
    assert_eq!(aborted(&outcome), "the move was aborted before its commit");
    world.assert_stayed().await;
    let mut expected = committed_calls();
    expected.truncate(3);
    assert_eq!(fake.calls(), expected);
}

/// etcd writes the commit but its answer is lost: the driver reads the tablet's record,
/// finds the destination there, and finishes the move as committed (never aborting it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_was_lost_is_read_back_as_committed() {
    let world = World::start().await;
    let w = world.clone();
    let fake = Fake::new().on(Call::Finish, move || {
        let w = w.clone();
        Box::pin(async move { w.proxy.lose(Lose::Answers) })
    });
    let outcome = world.run(&fake).await;
    assert_moved_with_stats(&outcome);
    world.assert_moved().await;
    assert_eq!(fake.calls(), committed_calls());
}

/// The commit never reaches etcd: the tablet's record shows no commit, so the move is
/// aborted as fenced — back to serving at the source — and both servers are told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_never_reached_etcd_is_aborted() {
    let world = World::start().await;
    let w = world.clone();
    let fake = Fake::new().on(Call::Finish, move || {
        let w = w.clone();
        Box::pin(async move { w.proxy.lose(Lose::Requests) })
    });
    let outcome = world.run(&fake).await;
    assert!(aborted(&outcome).starts_with("etcd: "), "{outcome:?}");
    world.assert_stayed().await;
    let mut expected = committed_calls();
    expected.truncate(3);
    expected.extend(told_abort());
    assert_eq!(fake.calls(), expected);
}

/// etcd writes the fence but its answer is lost: the abort as begun is refused (the records
/// are fenced now), so the driver aborts them as fenced — the tablet does not stay fenced,
/// served by nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_whose_answer_was_lost_is_aborted_as_fenced() {
    for lose in [Lose::Answers, Lose::Requests] {
        let world = World::start().await;
        let w = world.clone();
        let fake = Fake::new().on(Call::Receive, move || {
            let w = w.clone();
            Box::pin(async move { w.proxy.lose(lose) })
        });
        let outcome = world.run(&fake).await;
        assert!(
            aborted(&outcome).starts_with("etcd: "),
            "{lose:?}: {outcome:?}"
        );
        world.assert_stayed().await;
        let mut expected = calls(&["ReceiveTablet destination from source"]);
        expected.extend(told_abort());
        assert_eq!(fake.calls(), expected, "{lose:?}");
    }
}

/// etcd writes the move's record but its answer is lost: the driver deletes the record it
/// cannot know about, so no move of the tablet stays recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_begin_whose_answer_was_lost_leaves_no_record() {
    let world = World::start().await;
    let fake = Fake::new();
    world.proxy.lose(Lose::Answers);
    let outcome = world.run(&fake).await;
    assert!(aborted(&outcome).starts_with("etcd: "), "{outcome:?}");
    world.assert_stayed().await;
    // No server was asked to copy; the abort is said to both (a server ignores the abort of
    // a move it does not know).
    assert_eq!(fake.calls(), told_abort());
}

/// The default deadlines are the ones the master used before the driver went behind the
/// trait: ten minutes to copy, fifteen seconds for each short step.
#[test]
fn the_default_deadlines_are_unchanged() {
    assert_eq!(
        Deadlines::default(),
        Deadlines {
            receive: moves::RECEIVE_TIMEOUT,
            step: moves::STEP_TIMEOUT,
        }
    );
    assert_eq!(moves::RECEIVE_TIMEOUT, Duration::from_secs(600));
    assert_eq!(moves::STEP_TIMEOUT, Duration::from_secs(15));
}
