// node-redis (the `redis` package) against a server on 127.0.0.1: transactions, WATCH
// conflicts from a second connection, blocking pops woken by a push from another connection,
// pub/sub round trips, and in RESP3 the protocol's own types and commands on a subscribed
// connection. Usage: node node_redis_check.js PORT PROTOCOL (2 or 3). Prints
// "ok: N checks ..." and exits 0, or prints the first failed check on stderr and exits 1.
"use strict";

const { check, eq, waitFor, main } = require("./lib");
const { createClient, WatchError } = require("redis");

const port = Number(process.argv[2]);
const proto = Number(process.argv[3] || 2);

async function client() {
  const c = createClient({
    socket: { host: "127.0.0.1", port, connectTimeout: 10000, reconnectStrategy: false },
    RESP: proto,
  });
  // A broken connection fails the program (node-redis would otherwise only emit it).
  c.on("error", (e) => {
    console.error(`FAIL connection error: ${e}`);
    process.exit(1);
  });
  await c.connect();
  return c;
}

async function blockedClients(r) {
  const info = await r.info("clients");
  const m = /blocked_clients:(\d+)/.exec(info);
  return m ? Number(m[1]) : -1;
}

main(`node-redis protocol ${proto}`, async () => {
  const r = await client();
  const other = await client();
  await r.flushAll();

  const me = await r.sendCommand(["CLIENT", "INFO"]);
  check(String(me).includes(` resp=${proto}`), `CLIENT INFO says resp=${proto}: ${me}`);

  // --- MULTI/EXEC.
  eq(await r.multi().set("t:a", "1").incr("t:a").get("t:a").rPush("t:l", ["x", "y"]).exec(),
    ["OK", 2, "2", 2], "multi().exec() replies");
  // node-redis rejects a transaction with a failed command, handing over every reply.
  let mixed = null;
  try {
    await r.multi().set("t:s", "abc").incr("t:s").append("t:s", "d").exec();
  } catch (e) {
    eq(e.errorIndexes, [1], "MultiErrorReply names the failed command");
    mixed = e.replies;
  }
  check(Array.isArray(mixed), "EXEC with a runtime error rejects with the replies");
  eq(mixed.length, 3, "a runtime error keeps the other replies");
  eq(mixed[0], "OK", "set before the error");
  check(mixed[1] instanceof Error && /not an integer/.test(mixed[1].message),
    `INCR of a string fails inside EXEC: ${mixed[1]}`);
  eq(mixed[2], 4, "append after the error still ran");
  eq(await r.get("t:s"), "abcd", "the transaction's writes stay");
  let aborted = null;
  try {
    await r.multi().set("t:never", "1").addCommand(["NOSUCHCOMMAND"]).exec();
  } catch (e) {
    aborted = e;
  }
  check(aborted !== null && /EXECABORT|unknown command/i.test(String(aborted.message)),
    `a queuing error aborts the transaction: ${aborted}`);
  eq(await r.exists("t:never"), 0, "a discarded transaction wrote nothing");
  // A non-transactional pipeline (execAsPipeline) answers in order too.
  eq(await r.multi().set("p:1", "a").get("p:1").del("p:1").execAsPipeline(), ["OK", "a", 1],
    "execAsPipeline");

  // --- WATCH: a write from another connection makes EXEC fail with WatchError.
  await r.set("w:k", "0");
  eq(await r.watch("w:k"), "OK", "watch");
  await other.set("w:k", "theirs");
  let conflict = null;
  try {
    await r.multi().set("w:k", "mine").exec();
  } catch (e) {
    conflict = e;
  }
  check(conflict instanceof WatchError, `EXEC after a conflict is a WatchError: ${conflict}`);
  eq(await r.get("w:k"), "theirs", "the conflicting transaction wrote nothing");
  await r.watch("w:k");
  eq(await r.multi().set("w:k", "mine").exec(), ["OK"], "EXEC without a conflict");
  eq(await r.get("w:k"), "mine", "and it wrote");
  // WATCH-guarded increments from two connections: none lost.
  await r.set("w:n", "0");
  async function casIncrement(c, times) {
    for (let i = 0; i < times; i++) {
      for (;;) {
        await c.watch("w:n");
        const n = Number(await c.get("w:n"));
        try {
          await c.multi().set("w:n", String(n + 1)).exec();
          break;
        } catch (e) {
          if (!(e instanceof WatchError)) throw e;
        }
      }
    }
  }
  await Promise.all([casIncrement(r, 25), casIncrement(other, 25)]);
  eq(await r.get("w:n"), "50", "WATCH-guarded increments from two connections lose nothing");

  // --- Blocking pops.
  await r.rPush("b:q", "j1");
  eq(await r.blPop(["b:none", "b:q"], 1), { key: "b:q", element: "j1" }, "blPop with data");
  eq(await r.blPop("b:q", 0.05), null, "blPop times out with null");
  const waiter = await client();
  const popped = waiter.brPop("b:q", 10);
  await waitFor(async () => (await blockedClients(other)) === 1, "the waiter is blocked");
  eq(await other.lPush("b:q", "j2"), 1, "lPush from another connection");
  eq(await popped, { key: "b:q", element: "j2" }, "brPop woken by the push");
  eq(await r.exists("b:q"), 0, "the waiter took the element");
  const moved = waiter.blMove("b:src", "b:dst", "RIGHT", "LEFT", 10);
  await waitFor(async () => (await blockedClients(other)) === 1, "the blMove waiter is blocked");
  await other.rPush("b:src", "m1");
  eq(await moved, "m1", "blMove woken by the push");
  eq(await r.lRange("b:dst", 0, -1), ["m1"], "blMove moved it");
  const mpop = waiter.blmPop(10, ["b:m1", "b:m2"], "LEFT", { COUNT: 2 });
  await waitFor(async () => (await blockedClients(other)) === 1, "the blmPop waiter is blocked");
  await other.rPush("b:m2", ["a", "b", "c"]);
  eq(await mpop, ["b:m2", ["a", "b"]], "blmPop woken by the push");
  const zpop = waiter.bzPopMin("b:z", 10);
  await waitFor(async () => (await blockedClients(other)) === 1, "the bzPopMin waiter is blocked");
  await other.zAdd("b:z", [{ score: 2, value: "two" }, { score: 1, value: "one" }]);
  eq(await zpop, { key: "b:z", value: "one", score: 1 }, "bzPopMin woken by zAdd");
  waiter.destroy();

  // --- Pub/sub round trip.
  const sub = await client();
  const got = [];
  await sub.subscribe("ps:news", (msg, ch) => got.push(["message", ch, msg]));
  await sub.pSubscribe("ps:p.*", (msg, ch) => got.push(["pmessage", ch, msg]));
  eq(await r.pubSubNumSub(["ps:news", "ps:none"]), { "ps:news": 1, "ps:none": 0 }, "PUBSUB NUMSUB");
  eq(await r.pubSubNumPat(), 1, "PUBSUB NUMPAT");
  eq(await r.publish("ps:news", "hello"), 1, "publish reaches one subscriber");
  eq(await r.publish("ps:p.1", "patterned"), 1, "publish reaches the pattern");
  eq(await r.publish("ps:nobody", "lost"), 0, "publish to nobody");
  await waitFor(async () => got.length >= 2, "both messages arrive");
  eq(got, [["message", "ps:news", "hello"], ["pmessage", "ps:p.1", "patterned"]],
    "messages in order, with their channels");
  if (proto === 3) {
    // RESP3: a subscribed connection still runs ordinary commands, the messages coming as
    // push frames between the replies.
    eq(await sub.set("ps:k", "v"), "OK", "SET on a subscribed RESP3 connection");
    eq(await sub.get("ps:k"), "v", "GET on a subscribed RESP3 connection");
    eq(await r.publish("ps:news", "again"), 1, "publish while the subscriber runs commands");
    await waitFor(async () => got.length >= 3, "the third message arrives");
    eq(got[2], ["message", "ps:news", "again"], "a push frame between replies");
  }
  await sub.unsubscribe("ps:news");
  await sub.pUnsubscribe("ps:p.*");
  eq(await r.publish("ps:news", "after"), 0, "no subscriber after unsubscribe");
  sub.destroy();

  if (proto === 3) {
    // RESP3's own types: maps, doubles, sets.
    await r.hSet("r3:h", { f1: "v1", f2: "v2" });
    eq({ ...(await r.hGetAll("r3:h")) }, { f1: "v1", f2: "v2" }, "HGETALL as a map");
    await r.zAdd("r3:z", { score: 1.5, value: "m" });
    eq(await r.zScore("r3:z", "m"), 1.5, "ZSCORE as a double");
    await r.sAdd("r3:s", ["a", "b"]);
    eq((await r.sMembers("r3:s")).sort(), ["a", "b"], "SMEMBERS as a set");
  }

  r.destroy();
  other.destroy();
});
