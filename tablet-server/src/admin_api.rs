//! `google.bigtable.admin.v2.BigtableTableAdmin`: tables, column families, row-range drops and
//! consistency tokens.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use base64::Engine;
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use googleapis_tonic_google_longrunning::google::longrunning as lro;
use tonic::{Request, Response, Status};

use basalt_model::aggregate::Aggregator;
use basalt_model::schema::{
    parse_instance_name, parse_table_name, validate_family_id, validate_table_id,
};
use basalt_model::{FamilyChange, FamilySchema, RestoreInfo, TableSchema};
use basalt_storage::Store;

use crate::backups::Backups;
use crate::catalog::{Catalog, ConsistencyMode};
use crate::cluster::forwarding::reach;
use crate::error::{Error, Result, code_of, status};
use crate::iam_api::{IamApi, Kind};
use crate::metrics::Metrics;
use crate::proto::bigtable_table_admin_server::BigtableTableAdmin;
use crate::proto_time::{any, now_timestamp, timestamp};
use crate::translate;
use crate::translate::gc_rule::{gc_rule_from_proto, gc_rule_to_proto};

pub struct AdminService {
    store: Arc<Store>,
    /// Where schemas change: this server's store, or (cluster mode) the instance's catalog
    /// in etcd.
    catalog: Arc<dyn Catalog>,
    metrics: Arc<Metrics>,
    /// The cluster this server is, as reported in `cluster_states`.
    cluster_id: String,
    /// The IAM methods on tables.
    iam: Arc<IamApi>,
    /// Backups (None: a cluster server started without `--backup-url`).
    backups: Option<Arc<Backups>>,
}

const PAGE_SIZE_DEFAULT: usize = 100;

impl AdminService {
    pub fn new(
        store: Arc<Store>,
        catalog: Arc<dyn Catalog>,
        metrics: Arc<Metrics>,
        cluster_id: String,
        iam: Arc<IamApi>,
    ) -> Self {
        Self {
            store,
            catalog,
            metrics,
            cluster_id,
            iam,
            backups: None,
        }
    }

    /// The service with Bigtable's backup methods served by `backups`.
    pub fn with_backups(self, backups: Option<Arc<Backups>>) -> Self {
        Self { backups, ..self }
    }

    /// Before a DeleteTable or DropRowRange, which the change log does not hold: this
    /// server's log backup ships what it logged so far, the values it logged by reference
    /// read while the data still holds them (`docs/backups.md`, "Point-in-time recovery").
    async fn ship_log_first(&self) -> Result<()> {
        match self.backups.as_ref().and_then(|b| b.log_backup()) {
            Some(log) => log.ship_now().await,
            None => Ok(()),
        }
    }

    fn backups(&self) -> Result<&Arc<Backups>> {
        self.backups.as_ref().ok_or_else(|| {
            Error::Unimplemented(
                "backups need a backup location: this cluster's servers were started without --backup-url (docs/backups.md)"
                    .into(),
            )
        })
    }

    /// NOT_FOUND for an instance this server does not serve (cluster mode: another instance
    /// than the cluster's).
    fn check_instance(&self, instance: &str) -> Result<()> {
        self.catalog.check_instance(instance)
    }

    fn finish<T>(&self, rpc: &str, started: Instant, r: Result<T>) -> Result<Response<T>, Status> {
        let code = match &r {
            Ok(_) => tonic::Code::Ok,
            Err(e) => code_of(e),
        };
        self.metrics.observe(rpc, code, started);
        r.map(Response::new).map_err(status)
    }

    fn table(&self, name: &str) -> Result<Arc<TableSchema>> {
        parse_table_name(name)?;
        Ok(self.store.table(name)?)
    }

    /// Renders a schema in the requested view (`Unspecified` is the caller's default).
    fn render(&self, schema: &TableSchema, view: admin::table::View) -> admin::Table {
        use admin::table::View;
        let mut t = admin::Table {
            name: schema.name.clone(),
            ..Default::default()
        };
        let schema_part = matches!(view, View::SchemaView | View::Full);
        let replication = matches!(view, View::ReplicationView | View::Full);
        let encryption = matches!(view, View::EncryptionView | View::Full);
        if schema_part {
            t.column_families = schema
                .families
                .iter()
                .map(|(id, f)| {
                    (
                        id.clone(),
                        admin::ColumnFamily {
                            gc_rule: Some(
                                f.gc_rule.as_ref().map(gc_rule_to_proto).unwrap_or_default(),
                            ),
                            value_type: f.aggregate.map(aggregate_type),
                        },
                    )
                })
                .collect();
            t.granularity = admin::table::TimestampGranularity::Millis as i32;
            t.deletion_protection = schema.deletion_protection;
            t.restore_info = schema.restore.as_ref().map(restore_info);
        }
        if replication || encryption {
            let mut state = admin::table::ClusterState::default();
            if replication {
                state.replication_state =
                    admin::table::cluster_state::ReplicationState::Ready as i32;
            }
            if encryption {
                state.encryption_info = vec![admin::EncryptionInfo {
                    encryption_type: admin::encryption_info::EncryptionType::GoogleDefaultEncryption
                        as i32,
                    encryption_status: None,
                    kms_key_version: String::new(),
                }];
            }
            // Every cluster of the instance holds the table: READY, or INITIALIZING while a
            // cluster that joined the instance is being seeded with it (docs/replication.md).
            let mut clusters = self.catalog.replicas();
            if !clusters.contains(&self.cluster_id) {
                clusters.push(self.cluster_id.clone());
            }
            let initializing = self.catalog.initializing(schema);
            t.cluster_states = clusters
                .into_iter()
                .map(|c| {
                    let mut state = state.clone();
                    // A restore's table serves no data until its restore ends.
                    if replication && (initializing.contains(&c) || schema.restoring().is_some()) {
                        state.replication_state =
                            admin::table::cluster_state::ReplicationState::Initializing as i32;
                    }
                    (c, state)
                })
                .collect();
        }
        t
    }
}

/// Bigtable's `Table.restore_info` of a restored table.
fn restore_info(r: &RestoreInfo) -> admin::RestoreInfo {
    admin::RestoreInfo {
        source_type: admin::RestoreSourceType::Backup as i32,
        source_info: Some(admin::restore_info::SourceInfo::BackupInfo(
            admin::BackupInfo {
                backup: r.backup.clone(),
                start_time: Some(timestamp(r.start_time_micros)),
                end_time: Some(timestamp(r.end_time_micros)),
                source_table: r.source_table.clone(),
                source_backup: r.source_backup.clone().unwrap_or_default(),
            },
        )),
    }
}

fn view_of(raw: i32, default: admin::table::View) -> Result<admin::table::View> {
    match admin::table::View::try_from(raw) {
        Ok(admin::table::View::Unspecified) => Ok(default),
        Ok(v) => Ok(v),
        Err(_) => Err(Error::InvalidArgument(format!("unknown table view {raw}"))),
    }
}

fn family_schema(id: &str, cf: &admin::ColumnFamily) -> Result<FamilySchema> {
    validate_family_id(id)?;
    let aggregate = match &cf.value_type {
        Some(t) => Some(aggregator_of(id, t)?),
        None => None,
    };
    let gc_rule = match &cf.gc_rule {
        Some(r) => gc_rule_from_proto(r)?,
        None => None,
    };
    Ok(FamilySchema { gc_rule, aggregate })
}

/// The aggregator of a family's `value_type`: an Aggregate over big-endian Int64.
fn aggregator_of(id: &str, t: &admin::Type) -> Result<Aggregator> {
    use admin::r#type::Kind;
    use admin::r#type::aggregate::Aggregator as A;
    use admin::r#type::int64::encoding::Encoding as IntEncoding;
    let Some(Kind::AggregateType(agg)) = &t.kind else {
        return Err(Error::InvalidArgument(format!(
            "column family {id:?}: value_type must be an Aggregate type"
        )));
    };
    let aggregator = match &agg.aggregator {
        Some(A::Sum(_)) => Aggregator::Sum,
        Some(A::Min(_)) => Aggregator::Min,
        Some(A::Max(_)) => Aggregator::Max,
        // "Input: Any, or omit for Raw": no input type to check.
        Some(A::HllppUniqueCount(_)) => return Ok(Aggregator::Hll),
        None => {
            return Err(Error::InvalidArgument(format!(
                "column family {id:?}: the Aggregate value_type needs an aggregator (sum, min or max)"
            )));
        }
    };
    // An Int64 without an encoding is big-endian: that is what the Go client fills in and the
    // emulator assumes, and what the Python client sends for
    // `Type.Aggregate(input_type=Type(int64_type=Type.Int64()), sum=...)`.
    let int64_big_endian = matches!(
        agg.input_type.as_ref().and_then(|t| t.kind.as_ref()),
        Some(Kind::Int64Type(i)) if matches!(
            i.encoding.as_ref().and_then(|e| e.encoding.as_ref()),
            None | Some(IntEncoding::BigEndianBytes(_))
        )
    );
    if !int64_big_endian {
        return Err(Error::InvalidArgument(format!(
            "column family {id:?}: {aggregator:?} aggregates need input_type Int64 with big_endian_bytes encoding (or no encoding, which means big-endian)"
        )));
    }
    Ok(aggregator)
}

/// The `value_type` rendered for an aggregate family.
fn aggregate_type(aggregator: Aggregator) -> admin::Type {
    use admin::r#type::aggregate::{self, Aggregator as A};
    use admin::r#type::{Aggregate, Int64, Kind, bytes, int64};
    let raw_bytes = || admin::Type {
        kind: Some(Kind::BytesType(admin::r#type::Bytes {
            encoding: Some(bytes::Encoding {
                encoding: Some(bytes::encoding::Encoding::Raw(
                    bytes::encoding::Raw::default(),
                )),
            }),
        })),
    };
    let int64 = || admin::Type {
        kind: Some(Kind::Int64Type(Int64 {
            encoding: Some(int64::Encoding {
                encoding: Some(int64::encoding::Encoding::BigEndianBytes(
                    int64::encoding::BigEndianBytes::default(),
                )),
            }),
        })),
    };
    let (aggregator, input_type) = match aggregator {
        Aggregator::Sum => (A::Sum(aggregate::Sum {}), int64()),
        Aggregator::Min => (A::Min(aggregate::Min {}), int64()),
        Aggregator::Max => (A::Max(aggregate::Max {}), int64()),
        Aggregator::Hll => (
            A::HllppUniqueCount(aggregate::HyperLogLogPlusPlusUniqueCount {}),
            raw_bytes(),
        ),
    };
    // state_type: what reads return — the Int64 (for HyperLogLog++ the unique-count estimate,
    // the API's documented Int64 conversion of its state).
    admin::Type {
        kind: Some(Kind::AggregateType(Box::new(Aggregate {
            input_type: Some(Box::new(input_type)),
            state_type: Some(Box::new(int64())),
            aggregator: Some(aggregator),
        }))),
    }
}

#[tonic::async_trait]
impl BigtableTableAdmin for AdminService {
    async fn get_iam_policy(
        &self,
        request: Request<googleapis_tonic_google_iam_v1::google::iam::v1::GetIamPolicyRequest>,
    ) -> Result<Response<googleapis_tonic_google_iam_v1::google::iam::v1::Policy>, Status> {
        let started = Instant::now();
        let r = self.iam.get(request, Kind::Table).await;
        self.metrics.observe("GetIamPolicy", code(&r), started);
        r
    }

    async fn set_iam_policy(
        &self,
        request: Request<googleapis_tonic_google_iam_v1::google::iam::v1::SetIamPolicyRequest>,
    ) -> Result<Response<googleapis_tonic_google_iam_v1::google::iam::v1::Policy>, Status> {
        let started = Instant::now();
        let r = self.iam.set(request, Kind::Table).await;
        self.metrics.observe("SetIamPolicy", code(&r), started);
        r
    }

    async fn test_iam_permissions(
        &self,
        request: Request<
            googleapis_tonic_google_iam_v1::google::iam::v1::TestIamPermissionsRequest,
        >,
    ) -> Result<
        Response<googleapis_tonic_google_iam_v1::google::iam::v1::TestIamPermissionsResponse>,
        Status,
    > {
        let started = Instant::now();
        let r = self.iam.test(request, Kind::Table).await;
        self.metrics
            .observe("TestIamPermissions", code(&r), started);
        r
    }

    async fn create_table(
        &self,
        request: Request<admin::CreateTableRequest>,
    ) -> Result<Response<admin::Table>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let prepared = (|| {
            parse_instance_name(&req.parent)?;
            self.check_instance(&req.parent)?;
            validate_table_id(&req.table_id)?;
            let table = req.table.clone().unwrap_or_default();
            match admin::table::TimestampGranularity::try_from(table.granularity) {
                Ok(_) => {}
                Err(_) => {
                    return Err(Error::InvalidArgument(format!(
                        "unknown timestamp granularity {}",
                        table.granularity
                    )));
                }
            }
            if table.change_stream_config.is_some() {
                return Err(Error::Unimplemented(
                    "change streams are not supported by Basalt yet".into(),
                ));
            }
            let mut families = BTreeMap::new();
            for (id, cf) in &table.column_families {
                families.insert(id.clone(), family_schema(id, cf)?);
            }
            if families.len() > basalt_model::limits::MAX_FAMILIES_PER_TABLE {
                return Err(Error::InvalidArgument(format!(
                    "{} column families given; the maximum is {}",
                    families.len(),
                    basalt_model::limits::MAX_FAMILIES_PER_TABLE
                )));
            }
            let mut splits = Vec::with_capacity(req.initial_splits.len());
            for s in &req.initial_splits {
                translate::validate_row_key(&s.key)
                    .map_err(|e| Error::InvalidArgument(format!("initial_splits: {e}")))?;
                splits.push(s.key.to_vec());
            }
            splits.sort();
            splits.dedup();
            let name = format!("{}/tables/{}", req.parent, req.table_id);
            Ok((name, families, splits, table.deletion_protection))
        })();
        let r = async {
            let (name, families, splits, protect) = prepared?;
            let schema = self
                .catalog
                .create_table(TableSchema {
                    id: 0,
                    name,
                    families,
                    dropped_families: Default::default(),
                    deletion_protection: protect,
                    splits,
                    created_micros: 0,
                    restore: None,
                })
                .await?;
            Ok(self.render(&schema, admin::table::View::SchemaView))
        }
        .await;
        self.finish("CreateTable", started, r)
    }

    async fn list_tables(
        &self,
        request: Request<admin::ListTablesRequest>,
    ) -> Result<Response<admin::ListTablesResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let r = (|| {
            parse_instance_name(&req.parent)?;
            self.check_instance(&req.parent)?;
            let view = view_of(req.view, admin::table::View::NameOnly)?;
            if req.page_size < 0 {
                return Err(Error::InvalidArgument(
                    "page_size must not be negative".into(),
                ));
            }
            let page_size = if req.page_size == 0 {
                PAGE_SIZE_DEFAULT
            } else {
                req.page_size as usize
            };
            let after = if req.page_token.is_empty() {
                None
            } else {
                let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(&req.page_token)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| Error::InvalidArgument("invalid page_token".into()))?;
                Some(raw)
            };
            let all = self.store.list_tables(&req.parent);
            let mut rest = all
                .iter()
                .filter(|t| after.as_ref().is_none_or(|a| t.name.as_str() > a.as_str()))
                .peekable();
            let mut tables = Vec::new();
            while tables.len() < page_size {
                match rest.next() {
                    Some(t) => tables.push(self.render(t, view)),
                    None => break,
                }
            }
            let next_page_token = match (rest.peek(), tables.last()) {
                (Some(_), Some(last)) => {
                    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&last.name)
                }
                _ => String::new(),
            };
            Ok(admin::ListTablesResponse {
                tables,
                next_page_token,
            })
        })();
        self.finish("ListTables", started, r)
    }

    async fn get_table(
        &self,
        request: Request<admin::GetTableRequest>,
    ) -> Result<Response<admin::Table>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        self.catalog.catch_up(&req.name).await;
        let r = (|| {
            let view = view_of(req.view, admin::table::View::SchemaView)?;
            let schema = self.table(&req.name)?;
            Ok(self.render(&schema, view))
        })();
        self.finish("GetTable", started, r)
    }

    async fn update_table(
        &self,
        request: Request<admin::UpdateTableRequest>,
    ) -> Result<Response<lro::Operation>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let r = async {
            let table = req
                .table
                .ok_or_else(|| Error::InvalidArgument("table is required".into()))?;
            let paths = req.update_mask.map(|m| m.paths).unwrap_or_default();
            if paths.is_empty() {
                return Err(Error::InvalidArgument(
                    "update_mask must name at least one field, e.g. deletion_protection".into(),
                ));
            }
            let schema = self.table(&table.name)?;
            let mut protect = schema.deletion_protection;
            for path in &paths {
                match path.as_str() {
                    "deletion_protection" => protect = table.deletion_protection,
                    p if p.starts_with("change_stream_config")
                        || p.starts_with("automated_backup_policy")
                        || p.starts_with("row_key_schema")
                        || p.starts_with("tiered_storage_config") =>
                    {
                        return Err(Error::Unimplemented(format!(
                            "updating {p} is not supported by Basalt yet"
                        )));
                    }
                    p => {
                        return Err(Error::InvalidArgument(format!(
                            "update_mask path {p:?} is not an updatable field of Table"
                        )));
                    }
                }
            }
            let start = now_timestamp();
            let schema = self
                .catalog
                .set_deletion_protection(&table.name, protect)
                .await?;
            let rendered = self.render(&schema, admin::table::View::SchemaView);
            let metadata = admin::UpdateTableMetadata {
                name: schema.name.clone(),
                start_time: Some(start),
                end_time: Some(now_timestamp()),
            };
            Ok(lro::Operation {
                name: format!(
                    "operations/{}/locations/{}/operations/update-{}",
                    schema.name,
                    self.cluster_id,
                    self.store.clock_now()
                ),
                metadata: Some(any(
                    "google.bigtable.admin.v2.UpdateTableMetadata",
                    &metadata,
                )),
                done: true,
                result: Some(lro::operation::Result::Response(any(
                    "google.bigtable.admin.v2.Table",
                    &rendered,
                ))),
            })
        }
        .await;
        self.finish("UpdateTable", started, r)
    }

    async fn delete_table(
        &self,
        request: Request<admin::DeleteTableRequest>,
    ) -> Result<Response<()>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let r = async {
            let (instance, _) = parse_table_name(&req.name)?;
            self.check_instance(instance)?;
            self.ship_log_first().await?;
            self.catalog.delete_table(&req.name).await
        }
        .await;
        self.finish("DeleteTable", started, r)
    }

    async fn modify_column_families(
        &self,
        request: Request<admin::ModifyColumnFamiliesRequest>,
    ) -> Result<Response<admin::Table>, Status> {
        use admin::modify_column_families_request::modification::Mod;
        let started = Instant::now();
        let req = request.into_inner();
        let prepared = (|| {
            parse_table_name(&req.name)?;
            if req.modifications.is_empty() {
                return Err(Error::InvalidArgument(
                    "modifications must contain at least one modification".into(),
                ));
            }
            let mut changes = Vec::with_capacity(req.modifications.len());
            for m in &req.modifications {
                validate_family_id(&m.id)?;
                let change = match &m.r#mod {
                    Some(Mod::Create(cf)) => FamilyChange::Create {
                        id: m.id.clone(),
                        family: family_schema(&m.id, cf)?,
                    },
                    Some(Mod::Update(cf)) => {
                        if let Some(mask) = &m.update_mask
                            && let Some(p) = mask.paths.iter().find(|p| p.as_str() != "gc_rule")
                        {
                            return Err(Error::InvalidArgument(format!(
                                "column family {:?}: update_mask path {p:?} cannot be updated (only gc_rule)",
                                m.id
                            )));
                        }
                        let family = family_schema(&m.id, cf)?;
                        // With a mask naming gc_rule, other fields of the message are ignored.
                        let aggregate = if m.update_mask.is_some() {
                            None
                        } else {
                            family.aggregate
                        };
                        FamilyChange::Update {
                            id: m.id.clone(),
                            gc_rule: family.gc_rule,
                            aggregate,
                        }
                    }
                    Some(Mod::Drop(true)) => FamilyChange::Drop { id: m.id.clone() },
                    Some(Mod::Drop(false)) | None => {
                        return Err(Error::InvalidArgument(format!(
                            "modification of column family {:?} must set one of create, update or drop",
                            m.id
                        )));
                    }
                };
                changes.push(change);
            }
            Ok(changes)
        })();
        let r = async {
            let changes = prepared?;
            let schema = self
                .catalog
                .modify_column_families(&req.name, &changes)
                .await?;
            Ok(self.render(&schema, admin::table::View::SchemaView))
        }
        .await;
        self.finish("ModifyColumnFamilies", started, r)
    }

    async fn drop_row_range(
        &self,
        request: Request<admin::DropRowRangeRequest>,
    ) -> Result<Response<()>, Status> {
        use admin::drop_row_range_request::Target;
        let started = Instant::now();
        let reach = reach(&request);
        let req = request.into_inner();
        let r = async {
            parse_table_name(&req.name)?;
            let prefix = match req.target.clone() {
                Some(Target::RowKeyPrefix(p)) if !p.is_empty() => Some(p),
                Some(Target::RowKeyPrefix(_)) => {
                    return Err(Error::InvalidArgument(
                        "row_key_prefix must not be empty (use delete_all_data_from_table)".into(),
                    ));
                }
                Some(Target::DeleteAllDataFromTable(true)) => None,
                Some(Target::DeleteAllDataFromTable(false)) | None => {
                    return Err(Error::InvalidArgument(
                        "set row_key_prefix or delete_all_data_from_table".into(),
                    ));
                }
            };
            self.ship_log_first().await?;
            self.catalog.drop_row_range(&req, prefix, reach).await
        }
        .await;
        self.finish("DropRowRange", started, r)
    }

    async fn generate_consistency_token(
        &self,
        request: Request<admin::GenerateConsistencyTokenRequest>,
    ) -> Result<Response<admin::GenerateConsistencyTokenResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let r = async {
            let schema = self.table(&req.name)?;
            Ok(admin::GenerateConsistencyTokenResponse {
                consistency_token: self.catalog.consistency_token(&schema).await?,
            })
        }
        .await;
        self.finish("GenerateConsistencyToken", started, r)
    }

    async fn check_consistency(
        &self,
        request: Request<admin::CheckConsistencyRequest>,
    ) -> Result<Response<admin::CheckConsistencyResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let r = async {
            let schema = self.table(&req.name)?;
            match self
                .catalog
                .check_consistency(
                    &schema,
                    &req.consistency_token,
                    ConsistencyMode::of(req.mode),
                )
                .await?
            {
                Some(consistent) => Ok(admin::CheckConsistencyResponse { consistent }),
                None => Err(Error::InvalidArgument(format!(
                    "consistency token {:?} was not generated for table {}",
                    req.consistency_token, req.name
                ))),
            }
        }
        .await;
        self.finish("CheckConsistency", started, r)
    }

    async fn create_backup(
        &self,
        request: Request<admin::CreateBackupRequest>,
    ) -> Result<Response<lro::Operation>, Status> {
        let started = Instant::now();
        let r = async { self.backups()?.create(request.into_inner()).await }.await;
        self.finish("CreateBackup", started, r)
    }

    async fn get_backup(
        &self,
        request: Request<admin::GetBackupRequest>,
    ) -> Result<Response<admin::Backup>, Status> {
        let started = Instant::now();
        let r = async { self.backups()?.get(&request.get_ref().name).await }.await;
        self.finish("GetBackup", started, r)
    }

    async fn list_backups(
        &self,
        request: Request<admin::ListBackupsRequest>,
    ) -> Result<Response<admin::ListBackupsResponse>, Status> {
        let started = Instant::now();
        let r = async { self.backups()?.list(request.into_inner()).await }.await;
        self.finish("ListBackups", started, r)
    }

    async fn update_backup(
        &self,
        request: Request<admin::UpdateBackupRequest>,
    ) -> Result<Response<admin::Backup>, Status> {
        let started = Instant::now();
        let r = async { self.backups()?.update(request.into_inner()).await }.await;
        self.finish("UpdateBackup", started, r)
    }

    async fn delete_backup(
        &self,
        request: Request<admin::DeleteBackupRequest>,
    ) -> Result<Response<()>, Status> {
        let started = Instant::now();
        let r = async { self.backups()?.delete(&request.get_ref().name).await }.await;
        self.finish("DeleteBackup", started, r)
    }

    async fn restore_table(
        &self,
        request: Request<admin::RestoreTableRequest>,
    ) -> Result<Response<lro::Operation>, Status> {
        let started = Instant::now();
        let r = async {
            let to = crate::backups::restore_time(request.metadata())?;
            self.backups()?.restore(request.into_inner(), to).await
        }
        .await;
        self.finish("RestoreTable", started, r)
    }

    async fn copy_backup(
        &self,
        request: Request<admin::CopyBackupRequest>,
    ) -> Result<Response<lro::Operation>, Status> {
        let started = Instant::now();
        let r = async { self.backups()?.copy(request.into_inner()).await }.await;
        self.finish("CopyBackup", started, r)
    }
}

fn code<T>(r: &Result<T, Status>) -> tonic::Code {
    r.as_ref().map_or_else(|s| s.code(), |_| tonic::Code::Ok)
}

/// `google.longrunning.Operations`: the state of the backup operations this server runs (and,
/// in a cluster, those the other servers run or ran, as etcd records them).
pub struct OperationsService {
    backups: Option<Arc<Backups>>,
}

impl OperationsService {
    pub fn new(backups: Option<Arc<Backups>>) -> Self {
        Self { backups }
    }
}

#[tonic::async_trait]
impl crate::proto::operations_server::Operations for OperationsService {
    async fn get_operation(
        &self,
        request: Request<lro::GetOperationRequest>,
    ) -> Result<Response<lro::Operation>, Status> {
        let name = &request.get_ref().name;
        let r = match &self.backups {
            Some(b) => b.get_operation(name).await,
            None => Err(Error::NotFound(format!("operation {name} not found"))),
        };
        r.map(Response::new).map_err(status)
    }
}
