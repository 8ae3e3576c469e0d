//! A commit observer registered on a store sees every committed group once, in commit order,
//! with sequences 1, 2, 3, …, before any write of it is acknowledged: each write's physical
//! operations (while the observer wants them) and the versions it was given.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use basalt_storage::encoding::decode_key;
use basalt_storage::{
    CommitObserver, CommittedGroup, CommittedJob, LogOp, Store, StoreOptions, Versions,
};
use common::{TABLE, family, set};
use parking_lot::Mutex;

/// Keeps every group it sees; wants operations while `wants` is set.
#[derive(Default)]
struct Recorder {
    wants: AtomicBool,
    groups: Mutex<Vec<(u64, Vec<CommittedJob>)>>,
}

impl CommitObserver for Recorder {
    fn wants_ops(&self) -> bool {
        self.wants.load(Ordering::Relaxed)
    }

    fn committed(&self, group: &CommittedGroup<'_>) {
        self.groups.lock().push((group.seq, group.jobs.to_vec()));
    }
}

impl Recorder {
    /// The jobs seen so far, in commit order.
    fn jobs(&self) -> Vec<CommittedJob> {
        self.groups
            .lock()
            .iter()
            .flat_map(|(_, jobs)| jobs.clone())
            .collect()
    }
}

fn open(dir: &std::path::Path) -> (Store, Arc<Recorder>) {
    let recorder = Arc::new(Recorder::default());
    let store = Store::open_with_observers(
        dir,
        StoreOptions::default(),
        vec![recorder.clone() as Arc<dyn CommitObserver>],
    )
    .unwrap();
    (store, recorder)
}

/// The row each put of `job` writes.
fn rows_put(job: &CommittedJob) -> Vec<String> {
    job.ops
        .iter()
        .filter_map(|op| match op {
            LogOp::Put { key, .. } => {
                Some(String::from_utf8(decode_key(key).unwrap().row).unwrap())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn an_observer_sees_every_committed_group_in_commit_order() {
    let dir = tempfile::tempdir().unwrap();
    let (store, recorder) = open(dir.path());
    recorder.wants.store(true, Ordering::Relaxed);
    let store = Arc::new(store);
    let t = common::create(&store, [family("cf", None)], &[]);

    // Writers on four threads: each write is observed before it is acknowledged.
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (store, t, recorder) = (store.clone(), t.clone(), recorder.clone());
            std::thread::spawn(move || {
                for i in 0..50 {
                    let row = format!("w{w}-{i:02}");
                    store.mutate(&t, &[set(&row, "x")]).unwrap();
                    let seen = recorder.jobs().iter().any(|j| rows_put(j) == [row.clone()]);
                    assert!(seen, "{row} acknowledged before it was observed");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }

    let groups = recorder.groups.lock().clone();
    let seqs: Vec<u64> = groups.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (1..=groups.len() as u64).collect::<Vec<_>>());

    // Every write once, with its own single version; each writer's writes in the order it
    // made them, and their versions increasing in commit order.
    let mut by_writer: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
    let mut versions = Vec::new();
    for job in groups.iter().flat_map(|(_, jobs)| jobs) {
        let Versions {
            table_id,
            first,
            count,
        } = job.versions.expect("only writes of rows so far");
        assert_eq!((table_id, count), (t.id, 1));
        let hlc = first.hlc;
        let rows = rows_put(job);
        assert_eq!(rows.len(), 1, "{job:?}");
        by_writer
            .entry(rows[0][..2].to_string())
            .or_default()
            .push((rows[0].clone(), hlc));
        versions.push(hlc);
    }
    assert_eq!(versions.len(), 200);
    versions.sort_unstable();
    versions.dedup();
    assert_eq!(versions.len(), 200, "a version given twice");
    for (w, writes) in &by_writer {
        let rows: Vec<&str> = writes.iter().map(|(r, _)| r.as_str()).collect();
        let expected: Vec<String> = (0..50).map(|i| format!("{w}-{i:02}")).collect();
        assert_eq!(rows, expected);
        assert!(writes.windows(2).all(|p| p[0].1 < p[1].1), "{writes:?}");
    }

    // A deletion of rows through the committer is observed too, without versions.
    store.drop_row_range(TABLE, Some(b"w0")).unwrap();
    let last = recorder.jobs().pop().unwrap();
    assert_eq!(last.versions, None);
    assert!(
        matches!(&last.ops[..], [LogOp::DeleteRange { .. }]),
        "{last:?}"
    );
}

#[test]
fn without_an_observer_wanting_them_writes_carry_versions_but_no_operations() {
    let dir = tempfile::tempdir().unwrap();
    let (store, recorder) = open(dir.path());
    let t = common::create(&store, [family("cf", None)], &[]);
    let before = store.clock_now();
    store
        .mutate(&t, &[set("a", "1"), set("b", "2"), set("c", "3")])
        .unwrap();
    let last = recorder.jobs().pop().unwrap();
    assert!(last.ops.is_empty(), "{last:?}");
    let versions = last.versions.unwrap();
    assert_eq!((versions.table_id, versions.count), (t.id, 3));
    assert!(versions.first.hlc > before);
    assert!(versions.hlc_range().end <= store.clock_now() + 1);

    // Once it wants them, the next write carries them.
    recorder.wants.store(true, Ordering::Relaxed);
    store.mutate(&t, &[set("d", "4")]).unwrap();
    let last = recorder.jobs().pop().unwrap();
    assert_eq!(rows_put(&last), ["d"]);
}
