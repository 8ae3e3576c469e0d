//! Bigtable's IAM (Identity and Access Management), free of I/O: the policies set on the
//! instance and on tables, Bigtable's roles and the permissions they grant, and the checks the
//! API layer makes before it serves a call (and answers `TestIamPermissions` with).
//!
//! Why a model of its own: `GetIamPolicy`, `SetIamPolicy` and `TestIamPermissions` must answer
//! as Google's do (clients read-modify-write policies with etags, and tools test permissions
//! before they act), and every call must be checked the same way whichever frontend serves it.
//! Keeping the rules here, pure, lets storage keep policies as plain values and the servers
//! share one definition of who may do what.
//!
//! The roles and their permissions follow Google's Bigtable IAM roles
//! (`roles/bigtable.admin`, `.user`, `.reader`, `.viewer`), restricted to the permissions of the
//! calls Basalt serves; each role grants everything the role below it grants:
//!
//! * viewer: metadata only (instances, clusters, app profiles, tables, backups, locations, and
//!   the consistency checks);
//! * reader: viewer, plus reading data (`readRows`, `sampleRowKeys`, `readChangeStream`,
//!   `instances.ping`);
//! * user: reader, plus writing data (`mutateRows`);
//! * admin: user, plus changing schemas, backups, app profiles, clusters and IAM policies.
//!
//! Inheritance is Google's: a table's effective policy is the union of the instance's and its
//! own, so a grant on the instance reaches every table and a grant on a table reaches that
//! table only. Policies are `google.iam.v1.Policy` without conditions; the etag is the policy's
//! serial number (see [`etag_of`]), which is what makes concurrent read-modify-writes detectable.
//!
//! Groups are those an authenticator names for the caller (a Kubernetes user's groups, from
//! its TokenReview); otherwise groups and domains are matched as member strings only: Basalt
//! has no directory to resolve them, so `group:eng@example.com` grants to a caller
//! authenticated as that very member or said to belong to that group.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// One binding of a policy: a role granted to members.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub role: String,
    pub members: Vec<String>,
}

/// An IAM policy (google.iam.v1.Policy without conditions): `etag` is the policy's version
/// (8 bytes, big-endian serial number; see [`etag_of`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub version: i32,
    pub bindings: Vec<Binding>,
    pub etag: Vec<u8>,
}

/// Full control of the instance: data, schemas, backups, app profiles, clusters, policies.
pub const ADMIN: &str = "roles/bigtable.admin";
/// Reads and writes data.
pub const USER: &str = "roles/bigtable.user";
/// Reads data.
pub const READER: &str = "roles/bigtable.reader";
/// Reads metadata only.
pub const VIEWER: &str = "roles/bigtable.viewer";
/// Bigtable's roles, the most powerful first.
pub const ROLES: [&str; 4] = [ADMIN, USER, READER, VIEWER];

// Permission names, as Bigtable spells them.

/// Reads rows of a table (`ReadRows`, and the reads of `CheckAndMutateRow` and
/// `ReadModifyWriteRow` where Bigtable asks for it).
pub const READ_ROWS: &str = "bigtable.tables.readRows";
/// Samples a table's row keys (`SampleRowKeys`).
pub const SAMPLE_ROW_KEYS: &str = "bigtable.tables.sampleRowKeys";
/// Reads a table's change stream (`ReadChangeStream`, `GenerateInitialChangeStreamPartitions`).
pub const READ_CHANGE_STREAM: &str = "bigtable.tables.readChangeStream";
/// Writes rows of a table (`MutateRow(s)`, `CheckAndMutateRow`, `ReadModifyWriteRow`).
pub const MUTATE_ROWS: &str = "bigtable.tables.mutateRows";
/// Primes a connection to the instance (`PingAndWarm`).
pub const PING: &str = "bigtable.instances.ping";

/// Reads a table's schema (`GetTable`).
pub const TABLES_GET: &str = "bigtable.tables.get";
/// Lists an instance's tables (`ListTables`).
pub const TABLES_LIST: &str = "bigtable.tables.list";
/// Creates a table (`CreateTable`).
pub const TABLES_CREATE: &str = "bigtable.tables.create";
/// Deletes a table (`DeleteTable`).
pub const TABLES_DELETE: &str = "bigtable.tables.delete";
/// Changes a table (`UpdateTable`, `ModifyColumnFamilies`, `DropRowRange`).
pub const TABLES_UPDATE: &str = "bigtable.tables.update";
/// Checks replication consistency (`CheckConsistency`).
pub const CHECK_CONSISTENCY: &str = "bigtable.tables.checkConsistency";
/// Starts a consistency check (`GenerateConsistencyToken`).
pub const GENERATE_CONSISTENCY_TOKEN: &str = "bigtable.tables.generateConsistencyToken";
/// Reads a table's policy.
pub const TABLES_GET_IAM_POLICY: &str = "bigtable.tables.getIamPolicy";
/// Sets a table's policy.
pub const TABLES_SET_IAM_POLICY: &str = "bigtable.tables.setIamPolicy";

/// Reads the instance (`GetInstance`).
pub const INSTANCES_GET: &str = "bigtable.instances.get";
/// Lists instances (`ListInstances`).
pub const INSTANCES_LIST: &str = "bigtable.instances.list";
/// Changes the instance (`UpdateInstance`, `PartialUpdateInstance`).
pub const INSTANCES_UPDATE: &str = "bigtable.instances.update";
/// Reads the instance's policy.
pub const INSTANCES_GET_IAM_POLICY: &str = "bigtable.instances.getIamPolicy";
/// Sets the instance's policy.
pub const INSTANCES_SET_IAM_POLICY: &str = "bigtable.instances.setIamPolicy";

/// Reads a cluster (`GetCluster`).
pub const CLUSTERS_GET: &str = "bigtable.clusters.get";
/// Lists clusters (`ListClusters`).
pub const CLUSTERS_LIST: &str = "bigtable.clusters.list";
/// Changes a cluster (`UpdateCluster`, `PartialUpdateCluster`).
pub const CLUSTERS_UPDATE: &str = "bigtable.clusters.update";

/// Reads an app profile (`GetAppProfile`).
pub const APP_PROFILES_GET: &str = "bigtable.appProfiles.get";
/// Lists app profiles (`ListAppProfiles`).
pub const APP_PROFILES_LIST: &str = "bigtable.appProfiles.list";
/// Creates an app profile (`CreateAppProfile`).
pub const APP_PROFILES_CREATE: &str = "bigtable.appProfiles.create";
/// Changes an app profile (`UpdateAppProfile`).
pub const APP_PROFILES_UPDATE: &str = "bigtable.appProfiles.update";
/// Deletes an app profile (`DeleteAppProfile`).
pub const APP_PROFILES_DELETE: &str = "bigtable.appProfiles.delete";

/// Reads a backup (`GetBackup`).
pub const BACKUPS_GET: &str = "bigtable.backups.get";
/// Lists backups (`ListBackups`).
pub const BACKUPS_LIST: &str = "bigtable.backups.list";
/// Creates a backup (`CreateBackup`, `CopyBackup`).
pub const BACKUPS_CREATE: &str = "bigtable.backups.create";
/// Deletes a backup (`DeleteBackup`).
pub const BACKUPS_DELETE: &str = "bigtable.backups.delete";
/// Changes a backup (`UpdateBackup`).
pub const BACKUPS_UPDATE: &str = "bigtable.backups.update";
/// Restores a table from a backup (`RestoreTable`).
pub const BACKUPS_RESTORE: &str = "bigtable.backups.restore";
/// Reads a backup's policy.
pub const BACKUPS_GET_IAM_POLICY: &str = "bigtable.backups.getIamPolicy";
/// Sets a backup's policy.
pub const BACKUPS_SET_IAM_POLICY: &str = "bigtable.backups.setIamPolicy";

/// Lists a cluster's hot tablets (`ListHotTablets`; they show row keys).
pub const HOT_TABLETS_LIST: &str = "bigtable.hotTablets.list";

/// Lists the locations of the project.
pub const LOCATIONS_LIST: &str = "bigtable.locations.list";

/// What viewer grants: metadata, never data.
const VIEWER_PERMISSIONS: [&str; 13] = [
    INSTANCES_GET,
    INSTANCES_LIST,
    CLUSTERS_GET,
    CLUSTERS_LIST,
    APP_PROFILES_GET,
    APP_PROFILES_LIST,
    TABLES_GET,
    TABLES_LIST,
    CHECK_CONSISTENCY,
    GENERATE_CONSISTENCY_TOKEN,
    BACKUPS_GET,
    BACKUPS_LIST,
    LOCATIONS_LIST,
];

/// What reader adds to viewer: reading data.
const READER_ADDS: [&str; 4] = [READ_ROWS, SAMPLE_ROW_KEYS, READ_CHANGE_STREAM, PING];

/// What user adds to reader: writing data.
const USER_ADDS: [&str; 1] = [MUTATE_ROWS];

/// What admin adds to user: schemas, backups, app profiles, clusters, policies.
const ADMIN_ADDS: [&str; 19] = [
    TABLES_CREATE,
    TABLES_DELETE,
    TABLES_UPDATE,
    TABLES_GET_IAM_POLICY,
    TABLES_SET_IAM_POLICY,
    INSTANCES_GET_IAM_POLICY,
    INSTANCES_SET_IAM_POLICY,
    INSTANCES_UPDATE,
    BACKUPS_CREATE,
    BACKUPS_DELETE,
    BACKUPS_UPDATE,
    BACKUPS_RESTORE,
    BACKUPS_GET_IAM_POLICY,
    BACKUPS_SET_IAM_POLICY,
    APP_PROFILES_CREATE,
    APP_PROFILES_UPDATE,
    APP_PROFILES_DELETE,
    CLUSTERS_UPDATE,
    HOT_TABLETS_LIST,
];

// Each role is written as the role below it plus what it adds, so that the hierarchy cannot
// drift when a permission is added to a lower role.
const READER_PERMISSIONS: [&str; 17] = concat(&VIEWER_PERMISSIONS, &READER_ADDS);
const USER_PERMISSIONS: [&str; 18] = concat(&READER_PERMISSIONS, &USER_ADDS);
const ADMIN_PERMISSIONS: [&str; 37] = concat(&USER_PERMISSIONS, &ADMIN_ADDS);

/// `a` followed by `b`, at compile time (a wrong length `N` fails the build).
const fn concat<const A: usize, const B: usize, const N: usize>(
    a: &[&'static str; A],
    b: &[&'static str; B],
) -> [&'static str; N] {
    assert!(A + B == N, "concat: wrong length");
    let mut out = [""; N];
    let mut i = 0;
    while i < A {
        out[i] = a[i];
        i += 1;
    }
    let mut j = 0;
    while j < B {
        out[A + j] = b[j];
        j += 1;
    }
    out
}

/// Every permission a role grants (None: not one of Bigtable's roles).
pub fn role_permissions(role: &str) -> Option<&'static [&'static str]> {
    match role {
        ADMIN => Some(&ADMIN_PERMISSIONS),
        USER => Some(&USER_PERMISSIONS),
        READER => Some(&READER_PERMISSIONS),
        VIEWER => Some(&VIEWER_PERMISSIONS),
        _ => None,
    }
}

/// Every permission Basalt knows (sorted, no duplicates).
pub fn all_permissions() -> &'static [&'static str] {
    // Admin grants every permission there is; sorted once so that callers (and
    // `TestIamPermissions` answers) see a stable order.
    static ALL: OnceLock<Vec<&'static str>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut all: Vec<&'static str> = ROLES
            .iter()
            .flat_map(|role| role_permissions(role).unwrap_or_default().iter().copied())
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    })
}

/// The member that stands for every caller, authenticated or not.
const ALL_USERS: &str = "allUsers";
/// The member that stands for every authenticated caller.
const ALL_AUTHENTICATED_USERS: &str = "allAuthenticatedUsers";
/// The kinds of member that name someone after a `kind:` prefix.
const MEMBER_KINDS: [&str; 4] = ["user", "serviceAccount", "group", "domain"];
/// The most members a policy may hold across its bindings (Google's limit of principals per
/// policy; a principal in two bindings counts twice there too).
const MAX_MEMBERS: usize = 1500;
/// The policy versions `SetIamPolicy` accepts: 0 (unspecified, read as 1), 1, and 3 (the one
/// for conditions, which Basalt does not evaluate but whose number clients may send).
const VERSIONS: [i32; 3] = [0, 1, 3];

/// Whether `member` is a member string IAM accepts: "user:EMAIL-OR-NAME", "serviceAccount:X",
/// "group:X", "domain:X", "allUsers", "allAuthenticatedUsers" (the part after ':' non-empty,
/// no whitespace).
pub fn valid_member(member: &str) -> bool {
    if member == ALL_USERS || member == ALL_AUTHENTICATED_USERS {
        return true;
    }
    let Some((kind, name)) = member.split_once(':') else {
        return false;
    };
    MEMBER_KINDS.contains(&kind) && !name.is_empty() && !name.chars().any(char::is_whitespace)
}

/// INVALID_ARGUMENT-worthy problems of a policy a client sets: an unknown role, a binding
/// without members, a malformed member, a version other than 0, 1 or 3, more members than a
/// policy may hold. Returns Ok(()) or Err(PolicyError::Invalid(message)), the message naming
/// what is wrong so that the client can fix it.
pub fn validate(policy: &Policy) -> Result<(), PolicyError> {
    if !VERSIONS.contains(&policy.version) {
        return Err(PolicyError::Invalid(format!(
            "policy version {} is not supported; the versions are 0, 1 and 3",
            policy.version
        )));
    }
    let mut members = 0;
    for binding in &policy.bindings {
        if role_permissions(&binding.role).is_none() {
            return Err(PolicyError::Invalid(format!(
                "role {} is not supported for Bigtable resources; the roles are {}",
                binding.role,
                ROLES.join(", ")
            )));
        }
        if binding.members.is_empty() {
            return Err(PolicyError::Invalid(format!(
                "the binding of role {} has no members",
                binding.role
            )));
        }
        if let Some(bad) = binding.members.iter().find(|m| !valid_member(m)) {
            return Err(PolicyError::Invalid(format!(
                "member {bad:?} of role {} is malformed; members are user:, serviceAccount:, \
                 group:, domain: followed by a name, or {ALL_USERS}, or {ALL_AUTHENTICATED_USERS}",
                binding.role
            )));
        }
        members += binding.members.len();
    }
    if members > MAX_MEMBERS {
        return Err(PolicyError::Invalid(format!(
            "the policy has {members} members; a policy holds at most {MAX_MEMBERS}"
        )));
    }
    Ok(())
}

/// The policy that replaces `current` (None: never set) when a client sets `new`.
///
/// A non-empty `new.etag` must be the current policy's (the never-set policy's is
/// `etag_of(0)`): otherwise someone changed the policy since the client read it, and
/// [`PolicyError::Conflict`] tells it to read again (real IAM answers ABORTED). An empty etag
/// overwrites unconditionally, as in IAM. The policy stored is `new` validated and normalized:
/// bindings of the same role merged, members deduplicated and sorted, bindings sorted by role
/// and without empty ones, version 1 (or 3 if the client sent 3), the next etag.
pub fn replace(current: Option<&Policy>, new: Policy) -> Result<Policy, PolicyError> {
    let serial = serial(current);
    if !new.etag.is_empty() && new.etag != etag_of(serial) {
        return Err(PolicyError::Conflict(
            "there were concurrent policy changes; retry the whole read-modify-write \
             (GetIamPolicy, then SetIamPolicy with its etag)"
                .to_string(),
        ));
    }
    validate(&new)?;
    let mut roles: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for binding in new.bindings {
        roles
            .entry(binding.role)
            .or_default()
            .extend(binding.members);
    }
    let bindings = roles
        .into_iter()
        .filter(|(_, members)| !members.is_empty())
        .map(|(role, members)| Binding {
            role,
            members: members.into_iter().collect(),
        })
        .collect();
    Ok(Policy {
        // Conditions are not modelled, so 1 suffices; 3 is kept for a client that asked for it.
        version: if new.version == 3 { 3 } else { 1 },
        bindings,
        etag: etag_of(serial + 1),
    })
}

/// The etag of the policy's `n`-th version: 8 bytes, big-endian n.
pub fn etag_of(n: u64) -> Vec<u8> {
    n.to_be_bytes().to_vec()
}

/// The serial number of a policy, read back from its etag: 0 for None or an empty etag (and
/// for an etag that is not 8 bytes, which no stored policy has).
pub fn serial(policy: Option<&Policy>) -> u64 {
    policy
        .and_then(|p| <[u8; 8]>::try_from(p.etag.as_slice()).ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0)
}

/// The policy GetIamPolicy returns for a resource never set: no bindings, version 1,
/// `etag_of(0)` (so that a client may set it conditionally like any other).
pub fn empty() -> Policy {
    Policy {
        version: 1,
        bindings: Vec::new(),
        etag: etag_of(0),
    }
}

/// Why a policy cannot be set.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    /// The policy is malformed (INVALID_ARGUMENT).
    #[error("{0}")]
    Invalid(String),
    /// The client's etag is not the current policy's (ABORTED: read again and retry).
    #[error("{0}")]
    Conflict(String),
}

/// Whether `principal` (an authenticated caller, as a member string like
/// "user:alice@example.com") holds `permission` under `policies` — the instance's policy and,
/// for a table, the table's (inheritance: a table's effective policy is the union of the
/// instance's and its own). `members`: the caller's own member and those of the groups an
/// authenticator says it belongs to (Kubernetes' TokenReview). A binding's member matches
/// when equal to one of them, or "allAuthenticatedUsers", or "allUsers".
pub fn holds<M: AsRef<str>>(members: &[M], permission: &str, policies: &[&Policy]) -> bool {
    policies.iter().flat_map(|p| &p.bindings).any(|binding| {
        // A role Basalt does not know grants nothing (validate keeps them out anyway).
        role_permissions(&binding.role).is_some_and(|granted| granted.contains(&permission))
            && binding.members.iter().any(|member| {
                member == ALL_AUTHENTICATED_USERS
                    || member == ALL_USERS
                    || members.iter().any(|m| m.as_ref() == member)
            })
    })
}

/// TestIamPermissions: the subset of `asked` the caller (`members`, as [`holds`]) holds, in the
/// order asked, without duplicates.
pub fn granted<M: AsRef<str>>(
    members: &[M],
    asked: &[String],
    policies: &[&Policy],
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for permission in asked {
        if !out.contains(permission) && holds(members, permission, policies) {
            out.push(permission.clone());
        }
    }
    out
}

/// The bootstrap policy of `--admin-principal`: roles/bigtable.admin for each given member
/// (never stored; the server adds it to the instance's policies when it checks, so that a
/// fresh instance has someone who may set its first policy).
pub fn bootstrap(admins: &[String]) -> Policy {
    let members: BTreeSet<String> = admins.iter().cloned().collect();
    let bindings = if members.is_empty() {
        Vec::new()
    } else {
        vec![Binding {
            role: ADMIN.to_string(),
            members: members.into_iter().collect(),
        }]
    };
    Policy {
        version: 1,
        bindings,
        etag: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: &str = "user:alice@example.com";
    const BOB: &str = "user:bob@example.com";

    fn binding(role: &str, members: &[&str]) -> Binding {
        Binding {
            role: role.to_string(),
            members: members.iter().map(|m| m.to_string()).collect(),
        }
    }

    fn policy(bindings: Vec<Binding>) -> Policy {
        Policy {
            version: 1,
            bindings,
            etag: Vec::new(),
        }
    }

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    fn grant(role: &str, member: &str) -> Policy {
        policy(vec![binding(role, &[member])])
    }

    #[test]
    fn viewer_reads_metadata_not_data() {
        let p = grant(VIEWER, ALICE);
        for yes in [
            INSTANCES_GET,
            TABLES_GET,
            TABLES_LIST,
            CHECK_CONSISTENCY,
            BACKUPS_LIST,
        ] {
            assert!(holds(&[ALICE], yes, &[&p]), "{yes}");
        }
        for no in [READ_ROWS, SAMPLE_ROW_KEYS, PING, MUTATE_ROWS, TABLES_DELETE] {
            assert!(!holds(&[ALICE], no, &[&p]), "{no}");
        }
    }

    #[test]
    fn reader_reads_but_cannot_mutate() {
        let p = grant(READER, ALICE);
        for yes in [
            READ_ROWS,
            SAMPLE_ROW_KEYS,
            READ_CHANGE_STREAM,
            PING,
            TABLES_GET,
        ] {
            assert!(holds(&[ALICE], yes, &[&p]), "{yes}");
        }
        for no in [MUTATE_ROWS, TABLES_CREATE, TABLES_GET_IAM_POLICY] {
            assert!(!holds(&[ALICE], no, &[&p]), "{no}");
        }
    }

    #[test]
    fn user_writes_but_cannot_administer() {
        let p = grant(USER, ALICE);
        for yes in [MUTATE_ROWS, READ_ROWS, TABLES_LIST] {
            assert!(holds(&[ALICE], yes, &[&p]), "{yes}");
        }
        for no in [
            TABLES_DELETE,
            TABLES_CREATE,
            TABLES_UPDATE,
            TABLES_SET_IAM_POLICY,
            INSTANCES_SET_IAM_POLICY,
            BACKUPS_CREATE,
        ] {
            assert!(!holds(&[ALICE], no, &[&p]), "{no}");
        }
    }

    #[test]
    fn admin_holds_every_permission() {
        let p = grant(ADMIN, ALICE);
        for permission in all_permissions() {
            assert!(holds(&[ALICE], permission, &[&p]), "{permission}");
        }
        assert!(!holds(&[ALICE], "bigtable.tables.fly", &[&p]));
    }

    #[test]
    fn roles_nest_and_match_bigtable() {
        let set =
            |role| -> BTreeSet<&str> { role_permissions(role).unwrap().iter().copied().collect() };
        let (viewer, reader, user, admin) = (set(VIEWER), set(READER), set(USER), set(ADMIN));
        assert_eq!(
            (viewer.len(), reader.len(), user.len(), admin.len()),
            (13, 17, 18, 37)
        );
        assert!(viewer.is_subset(&reader) && reader.is_subset(&user) && user.is_subset(&admin));
        assert_eq!(
            reader.difference(&viewer).copied().collect::<Vec<_>>(),
            vec![PING, READ_CHANGE_STREAM, READ_ROWS, SAMPLE_ROW_KEYS]
        );
        assert_eq!(
            user.difference(&reader).copied().collect::<Vec<_>>(),
            vec![MUTATE_ROWS]
        );
        assert_eq!(role_permissions("roles/bigtable.owner"), None);
        assert_eq!(role_permissions("roles/owner"), None);
        // Every name is Bigtable's spelling of a permission.
        for permission in all_permissions() {
            let parts: Vec<&str> = permission.split('.').collect();
            assert_eq!(parts.len(), 3, "{permission}");
            assert_eq!(parts[0], "bigtable", "{permission}");
        }
    }

    #[test]
    fn all_permissions_sorted_unique_and_complete() {
        let all = all_permissions();
        assert_eq!(all.len(), 37);
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        let admin: BTreeSet<&str> = role_permissions(ADMIN).unwrap().iter().copied().collect();
        assert_eq!(all.iter().copied().collect::<BTreeSet<_>>(), admin);
    }

    #[test]
    fn instance_grant_applies_to_tables() {
        let instance = grant(READER, ALICE);
        let table = policy(vec![]);
        assert!(holds(&[ALICE], READ_ROWS, &[&instance, &table]));
        assert!(!holds(&[BOB], READ_ROWS, &[&instance, &table]));
    }

    #[test]
    fn table_grant_stays_with_its_table() {
        let instance = policy(vec![]);
        let t1 = grant(USER, ALICE);
        let t2 = policy(vec![]);
        assert!(holds(&[ALICE], MUTATE_ROWS, &[&instance, &t1]));
        assert!(!holds(&[ALICE], MUTATE_ROWS, &[&instance, &t2]));
        assert!(!holds(&[ALICE], MUTATE_ROWS, &[&instance]));
    }

    #[test]
    fn union_of_instance_and_table_grants() {
        // Viewer on the instance, writer on the table: both apply to the table.
        let instance = grant(VIEWER, ALICE);
        let table = policy(vec![binding(USER, &[ALICE])]);
        assert!(holds(&[ALICE], INSTANCES_GET, &[&instance, &table]));
        assert!(holds(&[ALICE], MUTATE_ROWS, &[&instance, &table]));
        assert!(!holds(&[ALICE], TABLES_DELETE, &[&instance, &table]));
    }

    #[test]
    fn all_users_and_all_authenticated_users_match_anyone() {
        for everyone in [ALL_USERS, ALL_AUTHENTICATED_USERS] {
            let p = grant(READER, everyone);
            assert!(holds(&[ALICE], READ_ROWS, &[&p]), "{everyone}");
            assert!(
                holds(&["serviceAccount:x@p.iam"], READ_ROWS, &[&p]),
                "{everyone}"
            );
            assert!(!holds(&[ALICE], MUTATE_ROWS, &[&p]), "{everyone}");
        }
        // Another member does not match.
        let p = grant(READER, BOB);
        assert!(!holds(&[ALICE], READ_ROWS, &[&p]));
    }

    #[test]
    fn a_grant_to_a_group_reaches_the_callers_said_to_belong_to_it() {
        const TEAM: &str = "group:system:serviceaccounts:shop";
        let instance = grant(READER, TEAM);
        let table = policy(vec![binding(USER, &[TEAM])]);
        let member = "serviceAccount:system:serviceaccount:shop:checkout";
        assert!(holds(&[member, TEAM], READ_ROWS, &[&instance]));
        assert!(!holds(&[member, TEAM], MUTATE_ROWS, &[&instance]));
        assert!(holds(&[member, TEAM], MUTATE_ROWS, &[&instance, &table]));
        // Without the group: nothing (no directory resolves it).
        assert!(!holds(&[member], READ_ROWS, &[&instance, &table]));
        assert!(!holds(
            &[member, "group:system:serviceaccounts:other"],
            READ_ROWS,
            &[&instance]
        ));
        assert_eq!(
            granted(
                &[member, TEAM],
                &strings(&[MUTATE_ROWS, TABLES_DELETE]),
                &[&instance, &table]
            ),
            strings(&[MUTATE_ROWS])
        );
    }

    #[test]
    fn unknown_role_in_a_policy_grants_nothing() {
        let p = grant("roles/owner", ALICE);
        assert!(!holds(&[ALICE], READ_ROWS, &[&p]));
    }

    #[test]
    fn granted_is_the_held_subset_in_order_without_duplicates() {
        let p = grant(READER, ALICE);
        let asked = strings(&[
            MUTATE_ROWS,
            SAMPLE_ROW_KEYS,
            READ_ROWS,
            "bigtable.tables.bogus",
            SAMPLE_ROW_KEYS,
            TABLES_GET,
            READ_ROWS,
        ]);
        assert_eq!(
            granted(&[ALICE], &asked, &[&p]),
            strings(&[SAMPLE_ROW_KEYS, READ_ROWS, TABLES_GET])
        );
        assert!(granted(&[BOB], &asked, &[&p]).is_empty());
        assert!(granted(&[ALICE], &[], &[&p]).is_empty());
    }

    #[test]
    fn valid_members() {
        for ok in [
            ALICE,
            "user:alice",
            "serviceAccount:sa@project.iam.gserviceaccount.com",
            "group:eng@example.com",
            "domain:example.com",
            "allUsers",
            "allAuthenticatedUsers",
        ] {
            assert!(valid_member(ok), "{ok}");
        }
        for bad in [
            "",
            "alice@example.com",
            "user:",
            "user: alice",
            "user:al ice",
            "user:alice\n",
            "robot:x",
            "User:alice",
            "allusers",
            "allUsers:x",
            ":alice",
        ] {
            assert!(!valid_member(bad), "{bad:?}");
        }
    }

    #[test]
    fn validate_rejects_unknown_role_naming_it() {
        let err = validate(&grant("roles/x", ALICE)).unwrap_err();
        let PolicyError::Invalid(message) = &err else {
            panic!("{err:?}");
        };
        assert!(message.contains("roles/x"), "{message}");
        assert!(
            message.contains("not supported for Bigtable resources"),
            "{message}"
        );
        for role in ROLES {
            assert!(message.contains(role), "{message}");
        }
    }

    #[test]
    fn validate_rejects_bad_member_naming_it() {
        let p = policy(vec![binding(READER, &[ALICE, "bob@example.com"])]);
        let err = validate(&p).unwrap_err();
        assert!(
            matches!(&err, PolicyError::Invalid(m) if m.contains("bob@example.com")),
            "{err}"
        );
    }

    #[test]
    fn validate_rejects_empty_binding_and_bad_versions() {
        let err = validate(&policy(vec![binding(USER, &[])])).unwrap_err();
        assert!(
            matches!(&err, PolicyError::Invalid(m) if m.contains(USER)),
            "{err}"
        );
        for version in [0, 1, 3] {
            let p = Policy {
                version,
                ..grant(USER, ALICE)
            };
            assert_eq!(validate(&p), Ok(()), "version {version}");
        }
        for version in [-1, 2, 4] {
            let p = Policy {
                version,
                ..grant(USER, ALICE)
            };
            let err = validate(&p).unwrap_err();
            assert!(
                matches!(&err, PolicyError::Invalid(m) if m.contains(&version.to_string())),
                "{err}"
            );
        }
        assert_eq!(validate(&policy(vec![])), Ok(()));
    }

    #[test]
    fn validate_limits_members() {
        let many: Vec<String> = (0..=MAX_MEMBERS).map(|i| format!("user:u{i}")).collect();
        let mut p = policy(vec![Binding {
            role: READER.to_string(),
            members: many,
        }]);
        assert!(matches!(validate(&p), Err(PolicyError::Invalid(_))));
        p.bindings[0].members.pop();
        assert_eq!(validate(&p), Ok(()));
    }

    #[test]
    fn replace_checks_etags() {
        // Never set: only the empty policy's etag (or none) is current.
        let first = Policy {
            etag: etag_of(0),
            ..grant(READER, ALICE)
        };
        let stored = replace(None, first.clone()).unwrap();
        assert_eq!(stored.etag, etag_of(1));
        let stale = Policy {
            etag: etag_of(1),
            ..grant(READER, ALICE)
        };
        assert!(matches!(
            replace(None, stale),
            Err(PolicyError::Conflict(_))
        ));

        // Set once: the old etag is stale, the current one succeeds.
        let err = replace(Some(&stored), first).unwrap_err();
        assert!(
            matches!(&err, PolicyError::Conflict(m) if m.contains("concurrent")),
            "{err}"
        );
        let next = Policy {
            etag: stored.etag.clone(),
            ..grant(USER, BOB)
        };
        let stored2 = replace(Some(&stored), next).unwrap();
        assert_eq!(stored2.etag, etag_of(2));
        assert_eq!(stored2.bindings, vec![binding(USER, &[BOB])]);
        // A malformed etag conflicts too.
        let odd = Policy {
            etag: vec![1, 2, 3],
            ..grant(USER, BOB)
        };
        assert!(matches!(
            replace(Some(&stored2), odd),
            Err(PolicyError::Conflict(_))
        ));
    }

    #[test]
    fn conflict_is_checked_before_validity() {
        // A stale write learns it must read again, whatever it carries.
        let stale = Policy {
            etag: etag_of(7),
            ..grant("roles/x", ALICE)
        };
        assert!(matches!(
            replace(None, stale),
            Err(PolicyError::Conflict(_))
        ));
    }

    #[test]
    fn empty_etag_overwrites_and_serial_increments() {
        let mut current: Option<Policy> = None;
        for n in 1..=5u64 {
            let stored = replace(current.as_ref(), grant(READER, ALICE)).unwrap();
            assert_eq!(serial(Some(&stored)), n);
            assert_eq!(stored.etag, etag_of(n));
            current = Some(stored);
        }
        // The invalid policy is still rejected without an etag.
        let err = replace(current.as_ref(), grant("roles/x", ALICE)).unwrap_err();
        assert!(matches!(err, PolicyError::Invalid(_)));
    }

    #[test]
    fn replace_merges_dedups_and_sorts() {
        let new = Policy {
            version: 0,
            bindings: vec![
                binding(VIEWER, &["user:zed", ALICE]),
                binding(ADMIN, &[BOB]),
                binding(VIEWER, &[ALICE, "group:eng@example.com", ALICE]),
            ],
            etag: Vec::new(),
        };
        let stored = replace(None, new).unwrap();
        assert_eq!(
            stored,
            Policy {
                version: 1,
                bindings: vec![
                    binding(ADMIN, &[BOB]),
                    binding(VIEWER, &["group:eng@example.com", ALICE, "user:zed"]),
                ],
                etag: etag_of(1),
            }
        );
    }

    #[test]
    fn replace_keeps_version_three_only() {
        for (sent, kept) in [(0, 1), (1, 1), (3, 3)] {
            let new = Policy {
                version: sent,
                ..grant(READER, ALICE)
            };
            assert_eq!(replace(None, new).unwrap().version, kept, "sent {sent}");
        }
    }

    #[test]
    fn etags_and_serials() {
        assert_eq!(etag_of(0), vec![0; 8]);
        assert_eq!(etag_of(0x0102), vec![0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(serial(None), 0);
        assert_eq!(serial(Some(&Policy::default())), 0);
        for n in [0, 1, 255, 256, u64::MAX] {
            let p = Policy {
                etag: etag_of(n),
                ..Policy::default()
            };
            assert_eq!(serial(Some(&p)), n);
        }
        assert_eq!(serial(Some(&empty())), 0);
    }

    #[test]
    fn empty_policy() {
        assert_eq!(
            empty(),
            Policy {
                version: 1,
                bindings: vec![],
                etag: etag_of(0),
            }
        );
        // A client that read the empty policy sets it conditionally.
        let new = Policy {
            etag: empty().etag,
            ..grant(ADMIN, ALICE)
        };
        assert_eq!(replace(None, new).unwrap().etag, etag_of(1));
    }

    #[test]
    fn bootstrap_grants_admin() {
        let p = bootstrap(&strings(&[BOB, ALICE, BOB]));
        assert_eq!(p.bindings, vec![binding(ADMIN, &[ALICE, BOB])]);
        assert!(holds(&[ALICE], INSTANCES_SET_IAM_POLICY, &[&p]));
        assert!(holds(&[BOB], TABLES_DELETE, &[&p]));
        assert!(!holds(&["user:eve@example.com"], READ_ROWS, &[&p]));
        assert!(bootstrap(&[]).bindings.is_empty());
        // Added to the instance's policies, it sits beside what was set.
        let set = grant(READER, "user:eve@example.com");
        assert!(holds(&["user:eve@example.com"], READ_ROWS, &[&set, &p]));
        assert!(holds(&[ALICE], MUTATE_ROWS, &[&set, &p]));
    }

    proptest::proptest! {
        /// Normalization keeps a policy's meaning: every principal holds after `replace`
        /// exactly what it held under the policy as sent, and the stored form is canonical
        /// (setting it again changes nothing but the etag).
        #[test]
        fn replace_preserves_meaning(
            raw in proptest::collection::vec(
                (0..ROLES.len(), proptest::collection::vec(0..5usize, 1..6)),
                0..8,
            ),
        ) {
            let members = [ALICE, BOB, "group:g", "domain:d", "serviceAccount:s"];
            let sent = policy(
                raw.iter()
                    .map(|(role, ms)| {
                        let ms: Vec<&str> = ms.iter().map(|m| members[*m]).collect();
                        binding(ROLES[*role], &ms)
                    })
                    .collect(),
            );
            let stored = replace(None, sent.clone()).unwrap();
            for principal in members {
                for permission in all_permissions() {
                    proptest::prop_assert_eq!(
                        holds(&[principal], permission, &[&stored]),
                        holds(&[principal], permission, &[&sent]),
                    );
                }
            }
            proptest::prop_assert!(stored.bindings.windows(2).all(|w| w[0].role < w[1].role));
            for b in &stored.bindings {
                proptest::prop_assert!(b.members.windows(2).all(|w| w[0] < w[1]));
            }
            let again = replace(Some(&stored), stored.clone()).unwrap();
            proptest::prop_assert_eq!(&again.bindings, &stored.bindings);
            proptest::prop_assert_eq!(serial(Some(&again)), 2);
        }
    }
}
