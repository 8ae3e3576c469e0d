//! The Key Visualizer's collector, run by the instance's master while it leads (so once per
//! instance, in both runtimes): a few seconds after every minute closes it asks every
//! registered tablet server of every cluster for the minutes it closed since it was last asked
//! and the sizes of the tablets it holds (`GetKeySamples`; the sizes of every cluster are
//! averaged, each holding the whole instance), merges them per table and minute into a column
//! ([`Column::from_samples`]), adds it to the table's layered history ([`TableHistory`]),
//! ages the layers, and writes what changed to etcd ([`Meta::write_keyviz`], fenced by the
//! master's term). A master that starts leading reads the history back first, so a restart or
//! a failover of the master keeps it; the servers keep their last 15 closed minutes, so the
//! minutes in between are collected late rather than lost.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use basalt_control::Dialer;
use basalt_control::v1::GetKeySamplesRequest;
use basalt_meta::keyviz::{ColumnKey, ColumnWrite};
use basalt_meta::{Meta, Term, table_id};
use basalt_model::keyviz::{Changed, Column, RangeCounts, TableHistory};
use tracing::{debug, warn};

use basalt_control::keyviz as codec;

/// How long after a minute closes it is collected: the servers close a minute on their own
/// clocks, which may lag a little.
pub const COLLECT_DELAY: Duration = Duration::from_secs(5);
/// How long one server gets to answer.
pub const SAMPLES_DEADLINE: Duration = Duration::from_secs(5);

/// The minute (since the Unix epoch) `at` falls in.
pub fn minute_of(at: SystemTime) -> i64 {
    let secs = at
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    secs.div_euclid(60)
}

/// Every table's history, as the collector holds it.
#[derive(Default)]
pub struct Histories {
    pub tables: BTreeMap<String, TableHistory>,
}

impl Histories {
    /// The history stored in etcd for the instance (`table`: one table's).
    pub async fn load(meta: &Meta, table: Option<&str>) -> basalt_model::Result<Histories> {
        Ok(Histories {
            tables: meta.keyviz_histories(table, codec::decode).await?,
        })
    }

    /// The latest minute of any table's finest layer (what a new master asks the servers
    /// after), if any.
    pub fn last_minute(&self) -> Option<i64> {
        self.tables
            .values()
            .filter_map(TableHistory::latest_minute)
            .max()
    }
}

/// The collector of one term.
pub struct Collector {
    meta: Meta,
    dialer: Dialer,
    term: Term,
    histories: Histories,
    /// The last minute collected from each server process: (store id, start time).
    cursors: HashMap<(String, i64), i64>,
    /// What a server not seen before is asked after.
    floor: i64,
}

impl Collector {
    /// Reads the stored history back (retrying while etcd does not answer).
    pub async fn start(meta: Meta, dialer: Dialer, term: Term) -> Collector {
        let histories = loop {
            match Histories::load(&meta, None).await {
                Ok(h) => break h,
                Err(error) => {
                    warn!(%error, "the Key Visualizer's history cannot be read yet; retrying");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        };
        let floor = histories.last_minute().unwrap_or(0);
        Collector {
            meta,
            dialer,
            term,
            histories,
            cursors: HashMap::new(),
            floor,
        }
    }

    /// Collects every minute until the task is aborted (the term ended) or etcd refuses the
    /// term's writes.
    pub async fn run(mut self) {
        loop {
            let now = SystemTime::now();
            let next = (minute_of(now) + 1) * 60;
            let at = UNIX_EPOCH + Duration::from_secs(next as u64) + COLLECT_DELAY;
            let wait = at.duration_since(now).unwrap_or_default();
            tokio::time::sleep(wait).await;
            match self.collect(SystemTime::now()).await {
                Ok(true) => {}
                Ok(false) => {
                    debug!("the term ended: the Key Visualizer's collector stops");
                    return;
                }
                Err(error) => warn!(%error, "Key Visualizer samples not collected this minute"),
            }
        }
    }

    /// One collection: every server's new minutes into the histories, the layers aged, the
    /// changes written. False if the term no longer leads.
    pub async fn collect(&mut self, now: SystemTime) -> basalt_model::Result<bool> {
        let (servers, _) = self.meta.servers(None).await?;
        // Every cluster holds the whole instance: the bytes stored are their average.
        let clusters = servers
            .iter()
            .map(|s| s.cluster.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            .max(1);
        let asks = servers.iter().map(|s| {
            let dialer = self.dialer.clone();
            let address = s.record.address.clone();
            let store = s.record.store_id.clone();
            let after = self
                .cursors
                .get(&(store.clone(), s.record.incarnation))
                .copied()
                .unwrap_or(self.floor);
            async move {
                let client = basalt_control::client(&dialer, &address, SAMPLES_DEADLINE)
                    .map_err(|e| e.to_string())?;
                let response = client
                    .clone()
                    .get_key_samples(GetKeySamplesRequest {
                        after_minute: after,
                    })
                    .await
                    .map_err(|s| s.message().to_string())?
                    .into_inner();
                Ok::<_, String>((store, response))
            }
        });
        let answers = futures::future::join_all(asks).await;
        let mut minutes: BTreeMap<(i64, String), Vec<RangeCounts>> = BTreeMap::new();
        for answer in answers {
            let (store, response) = match answer {
                Ok(a) => a,
                Err(error) => {
                    warn!(%error, "a tablet server's Key Visualizer samples are unavailable");
                    continue;
                }
            };
            for minute in response.minutes {
                let cursor = self
                    .cursors
                    .entry((store.clone(), response.start_time_micros))
                    .or_insert(self.floor);
                *cursor = (*cursor).max(minute.minute);
                for table in minute.tables {
                    let samples = minutes
                        .entry((minute.minute, table_id(&table.table_name).to_string()))
                        .or_default();
                    samples.extend(table.ranges.into_iter().map(codec::range_counts));
                    samples.extend(table.tablets.into_iter().map(|t| {
                        let mut size = codec::range_counts(t);
                        size.counts.stored_bytes /= clusters as f64;
                        size
                    }));
                }
            }
        }
        let mut changed: BTreeMap<String, Changed> = BTreeMap::new();
        for ((minute, table), samples) in minutes {
            let column = Column::from_samples(minute, samples);
            let history = self.histories.tables.entry(table.clone()).or_default();
            merge(changed.entry(table).or_default(), history.add(column));
        }
        let now_minute = minute_of(now);
        for (table, history) in self.histories.tables.iter_mut() {
            merge(
                changed.entry(table.clone()).or_default(),
                history.age(now_minute),
            );
        }
        // The tables that are gone take their history with them.
        let (tables, _) = self.meta.tables().await?;
        let gone: Vec<String> = self
            .histories
            .tables
            .keys()
            .filter(|t| {
                !tables
                    .iter()
                    .any(|s| table_id(&s.schema.name) == t.as_str())
            })
            .cloned()
            .collect();
        for table in gone {
            self.histories.tables.remove(&table);
            changed.remove(&table);
            if !self.meta.delete_keyviz_table(&self.term, &table).await? {
                return Ok(false);
            }
        }
        let mut writes = Vec::new();
        for (table, changed) in changed {
            let Some(history) = self.histories.tables.get(&table) else {
                continue;
            };
            for (layer, start_minute) in changed.written {
                if let Some(column) = history.column(layer, start_minute) {
                    writes.push(ColumnWrite::Put(
                        ColumnKey {
                            table: table.clone(),
                            layer,
                            start_minute,
                        },
                        codec::encode(column),
                    ));
                }
            }
            for (layer, start_minute) in changed.deleted {
                writes.push(ColumnWrite::Delete(ColumnKey {
                    table: table.clone(),
                    layer,
                    start_minute,
                }));
            }
        }
        if let Some(last) = self.histories.last_minute() {
            self.floor = self.floor.max(last);
        }
        self.meta.write_keyviz(&self.term, writes).await
    }
}

/// Adds `more` to `into`.
fn merge(into: &mut Changed, more: Changed) {
    *into = std::mem::take(into).and(more);
}

/// The collector of one term of the master, until the task is aborted.
pub async fn run(meta: Meta, dialer: Dialer, term: Term) {
    Collector::start(meta, dialer, term).await.run().await
}
