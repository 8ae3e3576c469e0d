// Scans a table with the official Node.js client, unchanged (only BIGTABLE_EMULATOR_HOST), and
// prints one JSON line per row: its key and, per cell of family cf1, the qualifier, the value's
// length and its SHA-256, so that e2e/test_scans.py can check every row and value.
// Usage: node scan.js TABLE [start end limit]   (empty strings for "none")
const crypto = require('node:crypto');
const {Bigtable} = require('@google-cloud/bigtable');

async function main() {
  const [table, start, end, limit] = process.argv.slice(2);
  const bt = new Bigtable({projectId: 'p'});
  const options = {decode: false};
  if (start) options.start = start;
  if (end) options.end = end;
  if (limit) options.limit = Number(limit);
  const stream = bt.instance('i').table(table).createReadStream(options);
  for await (const row of stream) {
    const cells = [];
    const family = row.data.cf1 || {};
    for (const qualifier of Object.keys(family).sort()) {
      for (const cell of family[qualifier]) {
        const value = Buffer.from(cell.value);
        cells.push([qualifier, value.length, crypto.createHash('sha256').update(value).digest('hex')]);
      }
    }
    process.stdout.write(JSON.stringify({key: Buffer.from(row.id).toString(), cells}) + '\n');
  }
}

main().catch(err => {
  console.error(err);
  process.exit(1);
});
