"""BigtableTableAdmin: tables, views, listing, deletion protection, column families,
DropRowRange, consistency tokens, initial splits."""

import os
import uuid
from datetime import timedelta

import pytest
from google.api_core import exceptions as gexc
from google.cloud.bigtable_admin_v2 import types as at

from btlib import (
    INSTANCE,
    MiB,
    Cell,
    View,
    create_table,
    delete_from_row,
    delete_table,
    drop_row_range,
    family_rules,
    gc_age,
    gc_intersection,
    gc_union,
    gc_versions,
    get_table,
    instance_name,
    mod_create,
    mod_drop,
    mod_update,
    set_cell,
    set_deletion_protection,
    table_name,
)

MILLIS = at.Table.TimestampGranularity.MILLIS
READY = at.Table.ClusterState.ReplicationState.READY

RULES = {
    "versions": gc_versions(3),
    "age": gc_age(86400),
    "nested": gc_union(gc_versions(10), gc_intersection(gc_age(3600), gc_versions(2))),
    "plain": None,
}


def expected_rules(families):
    return {f: (r if r is not None else at.GcRule()) for f, r in families.items()}


# ----------------------------------------------------------------- create / get


def test_create_table_returns_schema(bt):
    tid = bt.unique_id()
    created = create_table(bt.admin, tid, RULES)
    bt.track(tid)
    assert created.name == table_name(tid)
    assert family_rules(created) == expected_rules(RULES)
    assert created.granularity == MILLIS


def test_get_table_default_view_is_schema(bt):
    t = bt.table(RULES)
    got = bt.admin.get_table(request=at.GetTableRequest(name=t.name))
    assert got.name == t.name
    assert family_rules(got) == expected_rules(RULES)
    assert got.granularity == MILLIS
    assert len(got.cluster_states) == 0


def test_get_table_name_only_view(bt):
    t = bt.table(RULES)
    got = t.get(View.NAME_ONLY)
    assert got.name == t.name
    assert len(got.column_families) == 0
    assert len(got.cluster_states) == 0
    assert got.granularity == 0


def test_get_table_schema_view(bt):
    t = bt.table(RULES)
    got = t.get(View.SCHEMA_VIEW)
    assert got.name == t.name
    assert family_rules(got) == expected_rules(RULES)
    assert got.granularity == MILLIS
    assert len(got.cluster_states) == 0


def test_get_table_replication_view(bt):
    t = bt.table(RULES)
    got = t.get(View.REPLICATION_VIEW)
    assert got.name == t.name
    assert len(got.cluster_states) == 1
    (state,) = got.cluster_states.values()
    assert state.replication_state == READY
    assert len(got.column_families) == 0


def test_get_table_full_view(bt):
    t = bt.table(RULES, deletion_protection=True)
    got = t.get(View.FULL)
    assert got.name == t.name
    assert family_rules(got) == expected_rules(RULES)
    assert got.granularity == MILLIS
    assert [s.replication_state for s in got.cluster_states.values()] == [READY]
    assert got.deletion_protection is True


def test_get_unknown_table_is_not_found(bt):
    with pytest.raises(gexc.NotFound):
        get_table(bt.admin, table_name("no-such-table"))


@pytest.mark.parametrize(
    "name",
    [
        "no-such-table",
        "projects/p/instances/i/tables/",
        "projects/p/tables/x",
        "projects/p/instances/i/tables/x/extra",
        "projects/p/instances/i/tables/bad id",
    ],
)
def test_malformed_table_name_is_invalid_argument(bt, name):
    with pytest.raises(gexc.InvalidArgument):
        get_table(bt.admin, name)


def test_create_existing_table_is_already_exists(bt):
    t = bt.table(["cf"])
    with pytest.raises(gexc.AlreadyExists):
        create_table(bt.admin, t.id, ["other"])
    assert list(t.get().column_families) == ["cf"]


@pytest.mark.parametrize(
    "table_id",
    ["", "-leading-dash", ".leading-dot", "has space", "slash/inside", "x" * 51, "ünïcode"],
)
def test_bad_table_id_is_invalid_argument(bt, table_id):
    with pytest.raises(gexc.InvalidArgument):
        create_table(bt.admin, table_id, ["cf"])


@pytest.mark.parametrize("table_id", ["_leading_underscore", "a.b-c_D9", "9starts-with-digit", "x" * 50])
def test_good_table_ids_accepted(bt, table_id):
    tid = table_id if len(table_id) == 50 else f"{table_id}_{uuid.uuid4().hex[:8]}"
    t = bt.table(["cf"], table_id=tid)
    assert t.get(View.NAME_ONLY).name == table_name(tid)


@pytest.mark.parametrize("family", ["", "has space", "slash/inside", "colon:inside", "f" * 65])
def test_bad_family_id_is_invalid_argument(bt, family):
    with pytest.raises(gexc.InvalidArgument):
        create_table(bt.admin, bt.unique_id(), [family])
    t = bt.table(["cf"])
    with pytest.raises(gexc.InvalidArgument):
        t.modify(mod_create(family))
    assert list(t.get().column_families) == ["cf"]


def test_good_family_ids_accepted(bt):
    families = ["-dash", ".dot", "_under", "9", "Mixed.Case-id_0", "f" * 64]
    t = bt.table(families)
    assert sorted(t.get().column_families) == sorted(families)
    t.write(b"r", *[(f, b"q", 1000, f.encode()) for f in families])
    row = t.read_row(b"r")
    assert sorted(c.family for c in row.cells) == sorted(families)


# ------------------------------------------------------------------------- list


def _list_names(admin, instance=INSTANCE, page_size=0, view=0):
    pager = admin.list_tables(
        request=at.ListTablesRequest(parent=instance_name(instance), page_size=page_size, view=view)
    )
    pages = list(pager.pages)
    return pages, [t.name for p in pages for t in p.tables]


def test_list_tables_default_view_is_name_only(bt):
    t = bt.table(RULES)
    _, names = _list_names(bt.admin)
    assert t.name in names
    pages, _ = _list_names(bt.admin)
    listed = [x for p in pages for x in p.tables if x.name == t.name]
    assert len(listed) == 1
    assert len(listed[0].column_families) == 0


def test_list_tables_pagination(bt):
    mine = {bt.table(["cf"]).name for _ in range(5)}
    pages, names = _list_names(bt.admin, page_size=2)
    assert len(names) == len(set(names)), "a table was listed twice"
    assert mine <= set(names)
    assert all(len(p.tables) <= 2 for p in pages)
    assert len(pages) >= 3
    assert all(p.next_page_token for p in pages[:-1])
    assert not pages[-1].next_page_token
    # unpaginated listing agrees
    _, all_names = _list_names(bt.admin)
    assert sorted(all_names) == sorted(names)


def test_list_tables_is_per_instance(bt):
    t = bt.table(["cf"])
    other = bt.unique_id()
    create_table(bt.admin, other, ["cf"], instance="other-instance")
    try:
        _, names_other = _list_names(bt.admin, instance="other-instance")
        _, names_mine = _list_names(bt.admin)
        assert table_name(other, instance="other-instance") in names_other
        assert t.name not in names_other
        assert table_name(other, instance="other-instance") not in names_mine
        # same table id in two instances: independent tables
        create_table(bt.admin, t.id, ["zz"], instance="other-instance")
        got = get_table(bt.admin, table_name(t.id, instance="other-instance"))
        assert list(got.column_families) == ["zz"]
        assert list(t.get().column_families) == ["cf"]
        delete_table(bt.admin, table_name(t.id, instance="other-instance"))
    finally:
        delete_table(bt.admin, table_name(other, instance="other-instance"))


def test_list_tables_with_classic_client(bt):
    t = bt.table(["cf"])
    tables = bt.classic_client.instance(INSTANCE).list_tables()
    assert t.id in [x.table_id for x in tables]


# ------------------------------------------------------------ delete / protection


def test_delete_table(bt):
    t = bt.table(["cf"])
    t.write(b"r", ("cf", b"q", 1000, b"v"))
    delete_table(bt.admin, t.name)
    with pytest.raises(gexc.NotFound):
        t.get()
    with pytest.raises(gexc.NotFound):
        t.read()
    with pytest.raises(gexc.NotFound):
        delete_table(bt.admin, t.name)
    # re-creating the same id gives an empty table
    create_table(bt.admin, t.id, ["cf"])
    assert t.read() == []


def test_deletion_protection_lifecycle(bt):
    t = bt.table(["cf", "cf2"])
    t.write(b"r", ("cf", b"q", 1000, b"v"))
    updated = set_deletion_protection(bt.admin, t.name, True)
    assert updated.name == t.name
    assert t.get(View.FULL).deletion_protection is True

    with pytest.raises(gexc.FailedPrecondition):
        delete_table(bt.admin, t.name)
    with pytest.raises(gexc.FailedPrecondition):
        t.modify(mod_drop("cf2"))
    # still there, schema and data intact
    assert sorted(t.get().column_families) == ["cf", "cf2"]
    assert t.read_row(b"r").cells == [Cell("cf", b"q", 1000, b"v")]
    # data deletion through the data API is still allowed, and so is adding a family
    t.modify(mod_create("cf3"))
    t.mutate(b"r", delete_from_row())
    assert t.read() == []

    set_deletion_protection(bt.admin, t.name, False)
    assert t.get(View.FULL).deletion_protection is False
    t.modify(mod_drop("cf2"))
    delete_table(bt.admin, t.name)
    with pytest.raises(gexc.NotFound):
        t.get()


def test_update_table_returns_done_operation(bt):
    t = bt.table(["cf"])
    op = bt.admin.update_table(
        request=at.UpdateTableRequest(
            table=at.Table(name=t.name, deletion_protection=True),
            update_mask={"paths": ["deletion_protection"]},
        )
    )
    assert op.done()
    result = op.result(timeout=5)
    assert result.name == t.name
    assert result.deletion_protection is True


def test_update_unknown_table_is_not_found(bt):
    with pytest.raises(gexc.NotFound):
        set_deletion_protection(bt.admin, table_name("no-such-table"), True)


def test_create_with_deletion_protection(bt):
    t = bt.table(["cf"], deletion_protection=True)
    with pytest.raises(gexc.FailedPrecondition):
        delete_table(bt.admin, t.name)
    assert t.get(View.NAME_ONLY).name == t.name


# --------------------------------------------------------------- column families


def test_modify_families_create_update_drop(bt):
    t = bt.table({"cf": None})
    result = t.modify(mod_create("new", gc_versions(2)))
    assert family_rules(result) == {"cf": at.GcRule(), "new": gc_versions(2)}
    t.write(b"r", ("new", b"q", 1000, b"a"), ("new", b"q", 2000, b"b"), ("new", b"q", 3000, b"c"))
    assert [c.value for c in t.read_row(b"r").cells] == [b"c", b"b"]

    t.modify(mod_update("new", gc_age(3600)))
    assert family_rules(t.get()) == {"cf": at.GcRule(), "new": gc_age(3600)}

    t.modify(mod_drop("new"))
    assert family_rules(t.get()) == {"cf": at.GcRule()}
    assert t.read() == []
    with pytest.raises(gexc.NotFound):
        t.write(b"r", ("new", b"q", 1000, b"v"))


def test_modify_families_several_in_one_request(bt):
    t = bt.table({"a": None, "b": gc_versions(1)})
    t.modify(mod_create("c", gc_versions(5)), mod_update("b", gc_versions(7)), mod_drop("a"))
    assert family_rules(t.get()) == {"b": gc_versions(7), "c": gc_versions(5)}


def test_modify_families_with_classic_client(bt):
    from google.cloud.bigtable.column_family import MaxVersionsGCRule

    t = bt.table(["cf"])
    ct = t.classic_table
    cf = ct.column_family("extra", MaxVersionsGCRule(4))
    cf.create()
    families = ct.list_column_families()
    assert sorted(families) == ["cf", "extra"]
    assert families["extra"].gc_rule == MaxVersionsGCRule(4)
    cf.delete()
    assert sorted(ct.list_column_families()) == ["cf"]


def test_create_existing_family_is_already_exists(bt):
    t = bt.table({"cf": gc_versions(1)})
    with pytest.raises(gexc.AlreadyExists):
        t.modify(mod_create("cf", gc_versions(9)))
    assert family_rules(t.get()) == {"cf": gc_versions(1)}


@pytest.mark.parametrize("mod", [mod_update("missing", gc_versions(1)), mod_drop("missing")], ids=["update", "drop"])
def test_modify_missing_family_is_not_found(bt, mod):
    t = bt.table(["cf"])
    with pytest.raises(gexc.NotFound):
        t.modify(mod)
    assert list(t.get().column_families) == ["cf"]


@pytest.mark.parametrize(
    "mods, error",
    [
        ([mod_create("new1"), mod_drop("missing")], gexc.NotFound),
        ([mod_create("new2"), mod_update("cf", gc_versions(9)), mod_create("cf")], gexc.AlreadyExists),
        ([mod_drop("cf"), mod_update("missing", gc_versions(1))], gexc.NotFound),
        ([mod_update("cf", gc_versions(9)), mod_create("bad id")], gexc.InvalidArgument),
    ],
    ids=["create+drop-missing", "create+update+create-existing", "drop+update-missing", "update+bad-id"],
)
def test_modify_families_is_all_or_nothing(bt, mods, error):
    t = bt.table({"cf": gc_versions(1)})
    t.write(b"r", ("cf", b"q", 1000, b"v"))
    with pytest.raises(error):
        t.modify(*mods)
    assert family_rules(t.get()) == {"cf": gc_versions(1)}
    assert t.read_row(b"r").cells == [Cell("cf", b"q", 1000, b"v")]


def test_modify_families_of_unknown_table_is_not_found(bt):
    from btlib import modify_families

    with pytest.raises(gexc.NotFound):
        modify_families(bt.admin, table_name("no-such-table"), mod_create("cf"))


# ------------------------------------------------------------------ DropRowRange


def _fill(t, keys):
    t.mutate_rows([(k, [set_cell("cf", b"q", k, 1000)]) for k in keys])


def test_drop_row_range_by_prefix(bt):
    t = bt.table(["cf"])
    _fill(t, [b"user", b"user#1", b"user#2", b"user#2#x", b"users", b"usea", b"other", b"\xffz"])
    drop_row_range(bt.admin, t.name, prefix=b"user#")
    assert t.keys() == [b"other", b"usea", b"user", b"users", b"\xffz"]
    # new writes under the dropped prefix are visible again
    t.write(b"user#3", ("cf", b"q", 1000, b"new"))
    assert t.keys() == [b"other", b"usea", b"user", b"user#3", b"users", b"\xffz"]


def test_drop_row_range_binary_prefix(bt):
    t = bt.table(["cf"])
    _fill(t, [b"\x00\xff\xff", b"\x00\xff", b"\x01", b"\xff\xff", b"\xff\xff\x00"])
    drop_row_range(bt.admin, t.name, prefix=b"\xff\xff")
    assert t.keys() == [b"\x00\xff", b"\x00\xff\xff", b"\x01"]


def test_drop_all_data(bt):
    t = bt.table({"cf": gc_versions(2)})
    _fill(t, [b"a", b"b", b"c"])
    drop_row_range(bt.admin, t.name, all_data=True)
    assert t.read() == []
    assert family_rules(t.get()) == {"cf": gc_versions(2)}
    t.write(b"a", ("cf", b"q", 5000, b"again"))
    assert t.read() == [(b"a", [Cell("cf", b"q", 5000, b"again")])]


def test_drop_row_range_with_classic_client(bt):
    t = bt.table(["cf"])
    _fill(t, [b"p1", b"p2", b"q1"])
    t.classic_table.drop_by_prefix(b"p")
    assert t.keys() == [b"q1"]
    t.classic_table.truncate()
    assert t.keys() == []


def test_drop_row_range_unknown_table_is_not_found(bt):
    with pytest.raises(gexc.NotFound):
        drop_row_range(bt.admin, table_name("no-such-table"), all_data=True)


# ------------------------------------------------------------------- consistency


def test_consistency_token(bt):
    t = bt.table(["cf"])
    t.write(b"r", ("cf", b"q", 1000, b"v"))
    token = bt.admin.generate_consistency_token(
        request=at.GenerateConsistencyTokenRequest(name=t.name)
    ).consistency_token
    assert token
    resp = bt.admin.check_consistency(request=at.CheckConsistencyRequest(name=t.name, consistency_token=token))
    assert resp.consistent is True


def test_consistency_garbage_token_is_invalid_argument(bt):
    t = bt.table(["cf"])
    with pytest.raises(gexc.InvalidArgument):
        bt.admin.check_consistency(
            request=at.CheckConsistencyRequest(name=t.name, consistency_token="certainly-not-a-token")
        )


def test_consistency_unknown_table_is_not_found(bt):
    with pytest.raises(gexc.NotFound):
        bt.admin.generate_consistency_token(
            request=at.GenerateConsistencyTokenRequest(name=table_name("no-such-table"))
        )


# ------------------------------------------------------------ splits / sampling


def test_initial_splits_are_sample_keys(bt):
    t = bt.table(["cf"], splits=[b"g", b"p", b"\x00\x01"])
    samples = t.sample()
    keys = [k for k, _ in samples]
    assert keys[-1] == b""
    for split in (b"\x00\x01", b"g", b"p"):
        assert split in keys
    assert keys[:-1] == sorted(keys[:-1])
    offsets = [o for _, o in samples]
    assert offsets == sorted(offsets)
    assert all(o >= 0 for o in offsets)


def test_sample_row_keys_offsets_follow_data(bt):
    t = bt.table(["cf"], splits=[b"m"])
    chunk = 64 * 1024
    for prefix in (b"a", b"z"):
        for i in range(16):  # 16 x 64 KiB = 1 MiB of incompressible data per side
            t.write(prefix + b"%02d" % i, ("cf", b"q", 1000, os.urandom(chunk)))
    samples = t.sample()
    keys = [k for k, _ in samples]
    assert keys[-1] == b""
    assert b"m" in keys
    assert keys[:-1] == sorted(keys[:-1])
    offsets = [o for _, o in samples]
    assert offsets == sorted(offsets), samples
    m_offset = dict(samples)[b"m"]
    total = samples[-1][1]
    assert 0.5 * MiB <= m_offset <= 1.5 * MiB, samples
    assert 1.0 * MiB <= total <= 3.0 * MiB, samples


def test_sample_row_keys_clients_agree(bt):
    t = bt.table(["cf"], splits=[b"k"])
    t.write(b"a", ("cf", b"q", 1000, b"x" * 1000))
    gapic = t.sample()
    data = [(k, o) for k, o in t.data_table.sample_row_keys()]
    classic = [(r.row_key, r.offset_bytes) for r in t.classic_table.sample_row_keys()]
    assert [k for k, _ in data] == [k for k, _ in gapic] == [k for k, _ in classic]
    assert b"k" in [k for k, _ in gapic]


def test_classic_client_create_and_schema(bt):
    from google.cloud.bigtable.column_family import MaxAgeGCRule, MaxVersionsGCRule

    tid = bt.unique_id()
    ct = bt.classic_client.instance(INSTANCE).table(tid)
    ct.create(
        initial_split_keys=[b"k"],
        column_families={"v": MaxVersionsGCRule(2), "a": MaxAgeGCRule(timedelta(days=1))},
    )
    bt.track(tid)
    assert ct.exists()
    fams = ct.list_column_families()
    assert fams["v"].gc_rule == MaxVersionsGCRule(2)
    assert fams["a"].gc_rule == MaxAgeGCRule(timedelta(days=1))
    states = ct.get_cluster_states()
    assert len(states) == 1
    assert b"k" in [r.row_key for r in ct.sample_row_keys()]
    ct.delete()
    assert not ct.exists()
