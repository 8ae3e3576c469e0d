// The official Node.js client (@google-cloud/bigtable) over TLS with a custom CA and a client
// certificate (mutual TLS): `apiEndpoint` and `port` name the server, `sslCreds` carries the
// CA and the certificate (without `sslCreds` the client would silently go plaintext). The
// table (argv[2]) exists; the certificate's principal may write it. Exits non-zero on any
// mismatch.
const assert = require('node:assert/strict');
const fs = require('node:fs');
const grpc = require('@grpc/grpc-js');
const {Bigtable} = require('@google-cloud/bigtable');

async function main() {
  const sslCreds = grpc.credentials.createSsl(
    fs.readFileSync(process.env.BASALT_CA),
    fs.readFileSync(process.env.BASALT_KEY),
    fs.readFileSync(process.env.BASALT_CERT),
  );
  const bt = new Bigtable({
    projectId: 'p',
    apiEndpoint: process.env.BASALT_HOST,
    port: Number(process.env.BASALT_PORT),
    sslCreds,
  });
  const table = bt.instance('i').table(process.argv[2]);
  await table.insert([{key: 'tls', data: {cf: {q: 'over mutual TLS'}}}]);
  const [rows] = await table.getRows();
  assert.deepEqual(rows.map(r => r.id), ['tls']);
  assert.equal(rows[0].data.cf.q[0].value, 'over mutual TLS');
  console.log('node tls client: ok');
}

main().catch(e => {
  console.error(e);
  process.exit(1);
});
