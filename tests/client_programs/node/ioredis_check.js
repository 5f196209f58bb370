// ioredis against a server on 127.0.0.1: transactions, WATCH conflicts from a second
// connection, blocking pops woken by a push from another connection, pub/sub round trips.
// Usage: node ioredis_check.js PORT PROTOCOL (2 or 3). Prints "ok: N checks ..." and exits 0,
// or prints the first failed check on stderr and exits 1.
"use strict";

const { check, eq, waitFor, main } = require("./lib");
const Redis = require("ioredis");

const port = Number(process.argv[2]);
const proto = Number(process.argv[3] || 2);

function client(extra = {}) {
  return new Redis({
    ...extra,
    host: "127.0.0.1",
    port,
    protocol: proto,
    // A lost connection must fail the program, not be retried quietly.
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    connectTimeout: 10000,
    commandTimeout: 20000,
    lazyConnect: true,
  });
}

async function blockedClients(r) {
  const info = await r.info("clients");
  const m = /blocked_clients:(\d+)/.exec(info);
  return m ? Number(m[1]) : -1;
}

main(`ioredis protocol ${proto}`, async () => {
  const r = client();
  const other = client();
  await r.connect();
  await other.connect();
  await r.flushall();

  // The protocol the connection really speaks.
  const me = await r.call("CLIENT", "INFO");
  check(me.includes(` resp=${proto}`), `CLIENT INFO says resp=${proto}: ${me}`);

  if (proto === 3) {
    // RESP3's own types, as ioredis maps them when asked to.
    const m = client({ replyMapping: "resp3" });
    await m.connect();
    await m.hset("r3:h", "f1", "v1", "f2", "v2");
    eq({ ...(await m.call("HGETALL", "r3:h")) }, { f1: "v1", f2: "v2" }, "a RESP3 map is an object");
    await m.zadd("r3:z", 1.5, "m");
    eq(await m.call("ZSCORE", "r3:z", "m"), 1.5, "a RESP3 double is a number");
    eq(await m.multi().zscore("r3:z", "m").hgetall("r3:h").exec(),
      [[null, 1.5], [null, { f1: "v1", f2: "v2" }]], "RESP3 types inside EXEC");
    m.disconnect();
  }

  // --- MULTI/EXEC through multi(): every reply in order, with its own error.
  eq(
    await r.multi().set("t:a", "1").incr("t:a").get("t:a").rpush("t:l", "x", "y").exec(),
    [[null, "OK"], [null, 2], [null, "2"], [null, 2]],
    "multi().exec() replies",
  );
  const mixed = await r.multi().set("t:s", "abc").incr("t:s").append("t:s", "d").exec();
  eq(mixed.length, 3, "a runtime error keeps the other replies");
  eq(mixed[0], [null, "OK"], "set before the error");
  check(mixed[1][0] instanceof Error && /not an integer/.test(mixed[1][0].message),
    `INCR of a string fails inside EXEC: ${mixed[1][0]}`);
  eq(mixed[2], [null, 4], "append after the error still ran");
  eq(await r.get("t:s"), "abcd", "the transaction's writes stay");
  // A command refused while queuing discards the whole transaction.
  let aborted = null;
  try {
    await r.multi().set("t:never", "1").call("NOSUCHCOMMAND").exec();
  } catch (e) {
    aborted = e;
  }
  check(aborted && /EXECABORT/.test(aborted.message), `EXECABORT after a queuing error: ${aborted}`);
  eq(await r.exists("t:never"), 0, "a discarded transaction wrote nothing");
  // DISCARD.
  await r.multi({ pipeline: false });
  eq(await r.set("t:d", "1"), "QUEUED", "a command after multi() is queued");
  eq(await r.discard(), "OK", "discard");
  eq(await r.exists("t:d"), 0, "nothing of a discarded transaction ran");
  // A plain pipeline is not a transaction but still answers in order.
  eq(await r.pipeline().set("p:1", "a").get("p:1").del("p:1").exec(),
    [[null, "OK"], [null, "a"], [null, 1]], "pipeline().exec()");

  // --- WATCH: a write from another connection makes EXEC answer null.
  await r.set("w:k", "0");
  eq(await r.watch("w:k"), "OK", "watch");
  eq(await other.set("w:k", "theirs"), "OK", "the other connection writes the watched key");
  eq(await r.multi().set("w:k", "mine").exec(), null, "EXEC after a conflict is null");
  eq(await r.get("w:k"), "theirs", "the conflicting transaction wrote nothing");
  // Without a conflict the same transaction goes through.
  eq(await r.watch("w:k"), "OK", "watch again");
  eq(await r.multi().set("w:k", "mine").exec(), [[null, "OK"]], "EXEC without a conflict");
  eq(await r.get("w:k"), "mine", "and it wrote");
  // A check-and-set retry loop: two connections incrementing one counter through WATCH.
  await r.set("w:n", "0");
  async function casIncrement(c, times) {
    let retries = 0;
    for (let i = 0; i < times; i++) {
      for (;;) {
        await c.watch("w:n");
        const n = Number(await c.get("w:n"));
        const res = await c.multi().set("w:n", String(n + 1)).exec();
        if (res !== null) break;
        retries++;
      }
    }
    return retries;
  }
  await Promise.all([casIncrement(r, 25), casIncrement(other, 25)]);
  eq(await r.get("w:n"), "50", "WATCH-guarded increments from two connections lose nothing");

  // --- Blocking pops: at once with data, null on timeout, woken by another connection.
  eq(await r.rpush("b:q", "j1"), 1, "rpush");
  eq(await r.blpop("b:none", "b:q", 1), ["b:q", "j1"], "blpop with data answers at once");
  eq(await r.blpop("b:q", 0.05), null, "blpop times out with null");
  const waiter = client();
  await waiter.connect();
  const popped = waiter.brpop("b:q", 10);
  await waitFor(async () => (await blockedClients(other)) === 1, "the waiter is blocked");
  eq(await other.lpush("b:q", "j2"), 1, "lpush from another connection");
  eq(await popped, ["b:q", "j2"], "brpop woken by the push");
  eq(await r.exists("b:q"), 0, "the waiter took the element");
  const moved = waiter.blmove("b:src", "b:dst", "RIGHT", "LEFT", 10);
  await waitFor(async () => (await blockedClients(other)) === 1, "the blmove waiter is blocked");
  await other.rpush("b:src", "m1");
  eq(await moved, "m1", "blmove woken by the push");
  eq(await r.lrange("b:dst", 0, -1), ["m1"], "blmove moved it");
  const zpop = waiter.bzpopmin("b:z", 10);
  await waitFor(async () => (await blockedClients(other)) === 1, "the bzpopmin waiter is blocked");
  await other.zadd("b:z", 2, "two", 1, "one");
  eq(await zpop, ["b:z", "one", "1"], "bzpopmin woken by zadd");
  waiter.disconnect();

  // --- Pub/sub round trip: channel and pattern subscriptions on their own connection.
  const sub = client();
  await sub.connect();
  const got = [];
  sub.on("message", (ch, msg) => got.push(["message", ch, msg]));
  sub.on("pmessage", (pat, ch, msg) => got.push(["pmessage", pat, ch, msg]));
  eq(await sub.subscribe("ps:news", "ps:other"), 2, "subscribe counts its channels");
  eq(await sub.psubscribe("ps:p.*"), 3, "psubscribe counts channels and patterns");
  eq(await r.pubsub("NUMSUB", "ps:news", "ps:none"), ["ps:news", 1, "ps:none", 0], "PUBSUB NUMSUB");
  eq(await r.pubsub("NUMPAT"), 1, "PUBSUB NUMPAT");
  eq(await r.publish("ps:news", "hello"), 1, "publish reaches one subscriber");
  eq(await r.publish("ps:p.1", "patterned"), 1, "publish reaches the pattern");
  eq(await r.publish("ps:nobody", "lost"), 0, "publish to nobody");
  await waitFor(async () => got.length >= 2, "both messages arrive");
  eq(got, [["message", "ps:news", "hello"], ["pmessage", "ps:p.*", "ps:p.1", "patterned"]],
    "messages in order, with channel and pattern");
  eq(await sub.unsubscribe("ps:news", "ps:other"), 1, "unsubscribe leaves the pattern");
  eq(await sub.punsubscribe("ps:p.*"), 0, "punsubscribe leaves nothing");
  eq(await r.publish("ps:news", "after"), 0, "no subscriber after unsubscribe");
  sub.disconnect();

  r.disconnect();
  other.disconnect();
});
