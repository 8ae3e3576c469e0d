//! Generates the gRPC *server* side of Google's public Bigtable APIs.
//!
//! No crate ships server stubs for `google.bigtable.v2.Bigtable` or
//! `google.bigtable.admin.v2.BigtableTableAdmin`, and the googleapis `.proto` files are not
//! vendored here. The message types come from the `googleapis-tonic-*` crates; this script
//! declares the services (package, service and method names exactly as in googleapis, so the
//! HTTP/2 paths match what every client sends) with tonic-build's manual builder. Methods that
//! are not declared answer UNIMPLEMENTED, which is what clients expect for unsupported RPCs.

use tonic_build::manual::{Builder, Method, Service};

/// prost, with a request nested past protobuf's recursion limit answered INVALID_ARGUMENT
/// (`src/codec.rs`).
const CODEC: &str = "crate::codec::BasaltCodec";
const V2: &str = "googleapis_tonic_google_bigtable_v2::google::bigtable::v2";
const ADMIN: &str = "googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2";
const LRO: &str = "googleapis_tonic_google_longrunning::google::longrunning";
const IAM: &str = "googleapis_tonic_google_iam_v1::google::iam::v1";

/// The IAM methods every Bigtable admin service has (on instances, on tables).
const IAM_METHODS: [(&str, &str, &str, &str); 3] = [
    (
        "get_iam_policy",
        "GetIamPolicy",
        "GetIamPolicyRequest",
        "Policy",
    ),
    (
        "set_iam_policy",
        "SetIamPolicy",
        "SetIamPolicyRequest",
        "Policy",
    ),
    (
        "test_iam_permissions",
        "TestIamPermissions",
        "TestIamPermissionsRequest",
        "TestIamPermissionsResponse",
    ),
];

fn method(name: &str, route: &str, input: String, output: String, streaming: bool) -> Method {
    let builder = Method::builder()
        .name(name)
        .route_name(route)
        .input_type(input)
        .output_type(output)
        .codec_path(CODEC);
    if streaming {
        builder.server_streaming().build()
    } else {
        builder.build()
    }
}

fn main() {
    let data = [
        (
            "read_rows",
            "ReadRows",
            "ReadRowsRequest",
            "ReadRowsResponse",
            true,
        ),
        (
            "sample_row_keys",
            "SampleRowKeys",
            "SampleRowKeysRequest",
            "SampleRowKeysResponse",
            true,
        ),
        (
            "mutate_row",
            "MutateRow",
            "MutateRowRequest",
            "MutateRowResponse",
            false,
        ),
        (
            "mutate_rows",
            "MutateRows",
            "MutateRowsRequest",
            "MutateRowsResponse",
            true,
        ),
        (
            "check_and_mutate_row",
            "CheckAndMutateRow",
            "CheckAndMutateRowRequest",
            "CheckAndMutateRowResponse",
            false,
        ),
        (
            "ping_and_warm",
            "PingAndWarm",
            "PingAndWarmRequest",
            "PingAndWarmResponse",
            false,
        ),
        (
            "read_modify_write_row",
            "ReadModifyWriteRow",
            "ReadModifyWriteRowRequest",
            "ReadModifyWriteRowResponse",
            false,
        ),
    ];
    let mut bigtable = Service::builder()
        .name("Bigtable")
        .package("google.bigtable.v2");
    for (name, route, input, output, streaming) in data {
        bigtable = bigtable.method(method(
            name,
            route,
            format!("{V2}::{input}"),
            format!("{V2}::{output}"),
            streaming,
        ));
    }

    let admin_methods = [
        ("create_table", "CreateTable", "CreateTableRequest", "Table"),
        (
            "list_tables",
            "ListTables",
            "ListTablesRequest",
            "ListTablesResponse",
        ),
        ("get_table", "GetTable", "GetTableRequest", "Table"),
        (
            "update_table",
            "UpdateTable",
            "UpdateTableRequest",
            "@Operation",
        ),
        ("delete_table", "DeleteTable", "DeleteTableRequest", "()"),
        (
            "modify_column_families",
            "ModifyColumnFamilies",
            "ModifyColumnFamiliesRequest",
            "Table",
        ),
        (
            "drop_row_range",
            "DropRowRange",
            "DropRowRangeRequest",
            "()",
        ),
        (
            "generate_consistency_token",
            "GenerateConsistencyToken",
            "GenerateConsistencyTokenRequest",
            "GenerateConsistencyTokenResponse",
        ),
        (
            "check_consistency",
            "CheckConsistency",
            "CheckConsistencyRequest",
            "CheckConsistencyResponse",
        ),
        (
            "create_backup",
            "CreateBackup",
            "CreateBackupRequest",
            "@Operation",
        ),
        ("get_backup", "GetBackup", "GetBackupRequest", "Backup"),
        (
            "list_backups",
            "ListBackups",
            "ListBackupsRequest",
            "ListBackupsResponse",
        ),
        (
            "update_backup",
            "UpdateBackup",
            "UpdateBackupRequest",
            "Backup",
        ),
        ("delete_backup", "DeleteBackup", "DeleteBackupRequest", "()"),
        (
            "restore_table",
            "RestoreTable",
            "RestoreTableRequest",
            "@Operation",
        ),
        (
            "copy_backup",
            "CopyBackup",
            "CopyBackupRequest",
            "@Operation",
        ),
    ];
    let mut admin = Service::builder()
        .name("BigtableTableAdmin")
        .package("google.bigtable.admin.v2");
    for (name, route, input, output) in admin_methods {
        let output = match output {
            "()" => "crate::proto::Empty".to_string(),
            "@Operation" => format!("{LRO}::Operation"),
            other => format!("{ADMIN}::{other}"),
        };
        admin = admin.method(method(
            name,
            route,
            format!("{ADMIN}::{input}"),
            output,
            false,
        ));
    }
    // The instance admin API: its IAM methods and ListHotTablets (instances, clusters and app
    // profiles are Kubernetes resources, managed by the operator).
    let mut instance_admin = Service::builder()
        .name("BigtableInstanceAdmin")
        .package("google.bigtable.admin.v2")
        .method(method(
            "list_hot_tablets",
            "ListHotTablets",
            format!("{ADMIN}::ListHotTabletsRequest"),
            format!("{ADMIN}::ListHotTabletsResponse"),
            false,
        ));
    for (name, route, input, output) in IAM_METHODS {
        let iam = || {
            method(
                name,
                route,
                format!("{IAM}::{input}"),
                format!("{IAM}::{output}"),
                false,
            )
        };
        admin = admin.method(iam());
        instance_admin = instance_admin.method(iam());
    }

    // google.longrunning.Operations: what clients poll a long-running operation's state with
    // (CreateBackup, RestoreTable, CopyBackup).
    let operations = Service::builder()
        .name("Operations")
        .package("google.longrunning")
        .method(method(
            "get_operation",
            "GetOperation",
            format!("{LRO}::GetOperationRequest"),
            format!("{LRO}::Operation"),
            false,
        ));
    Builder::new().build_client(false).compile(&[
        bigtable.build(),
        admin.build(),
        instance_admin.build(),
        operations.build(),
    ]);
}
