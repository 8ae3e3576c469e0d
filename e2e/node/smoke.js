// The official Node.js client (@google-cloud/bigtable), unchanged, against Basalt: the only
// configuration is BIGTABLE_EMULATOR_HOST. Exits non-zero with a message on any mismatch.
const assert = require('node:assert/strict');
const {Bigtable} = require('@google-cloud/bigtable');

async function main() {
  const bt = new Bigtable({projectId: 'p'});
  const table = bt.instance('i').table(process.argv[2] || `node_smoke_${Date.now()}`);
  await table.create({families: [{name: 'cf', rule: {versions: 2}}]});
  const [exists] = await table.exists();
  assert.equal(exists, true);

  // MutateRows, then ReadRows of the whole table, in key order.
  await table.insert([
    {key: 'bob', data: {cf: {name: 'Bob'}}},
    {key: 'alice', data: {cf: {name: 'Alice', city: 'Paris'}}},
  ]);
  const [rows] = await table.getRows();
  assert.deepEqual(rows.map(r => r.id), ['alice', 'bob']);
  assert.equal(rows[0].data.cf.city[0].value, 'Paris');

  // GC: max_num_versions = 2 keeps the two newest versions.
  for (const [i, v] of ['v1', 'v2', 'v3'].entries()) {
    await table.row('versions').save({cf: {q: {value: v, timestamp: (i + 1) * 1000}}});
  }
  const [[vrow]] = await table.getRows({keys: ['versions']});
  assert.deepEqual(vrow.data.cf.q.map(c => c.value), ['v3', 'v2']);

  // ReadModifyWriteRow: increment from missing (0), twice.
  const counter = table.row('counter');
  await counter.increment('cf:n', 5);
  const [n] = await counter.increment('cf:n', 2);
  assert.equal(n, 7);

  // CheckAndMutateRow with a value filter.
  const [matched] = await table
    .row('alice')
    .filter([{column: 'name'}, {value: 'Alice'}], {onMatch: [{method: 'insert', data: {cf: {seen: 'yes'}}}]});
  assert.equal(matched, true);
  const [[alice]] = await table.getRows({keys: ['alice']});
  assert.equal(alice.data.cf.seen[0].value, 'yes');

  // Bad input gets Bigtable's status codes: unknown family → NOT_FOUND (5).
  await assert.rejects(table.insert([{key: 'x', data: {nope: {q: 'v'}}}]), e => {
    const codes = (e.errors || [e]).map(x => x.code);
    assert.ok(codes.includes(5), `expected NOT_FOUND, got ${JSON.stringify(codes)}`);
    return true;
  });

  await table.delete();
  const [after] = await table.exists();
  assert.equal(after, false);
  console.log('node client: ok');
}

main().catch(e => {
  console.error('node client: FAILED', e);
  process.exit(1);
});
