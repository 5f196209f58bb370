// Checks shared by the Node.js client programs: each failed check stops the program with a
// message on stderr and exit code 1; a passing run prints "ok: N checks, <what>".
"use strict";

const util = require("node:util");

let checks = 0;
// The last check that passed, for the failure message of one that never returns.
let last = "(none yet)";

class CheckFailed extends Error {}

function check(cond, what) {
  if (!cond) throw new CheckFailed(`FAIL ${what}`);
  checks++;
  last = what;
}

function eq(got, want, what) {
  if (!util.isDeepStrictEqual(got, want)) {
    throw new CheckFailed(
      `FAIL ${what}: got ${util.inspect(got, { depth: 6 })}, want ${util.inspect(want, { depth: 6 })}`,
    );
  }
  checks++;
  last = what;
}

// Polls `cond` every 10 ms for at most 10 s; fails the check past that.
async function waitFor(cond, what) {
  const deadline = Date.now() + 10000;
  while (Date.now() < deadline) {
    if (await cond()) {
      checks++;
      last = what;
      return;
    }
    await new Promise((res) => setTimeout(res, 10));
  }
  throw new CheckFailed(`FAIL ${what}: not within 10 s`);
}

function main(what, body) {
  // Nothing may hang: the whole program has 60 s.
  const timer = setTimeout(() => {
    console.error(`FAIL ${what}: still running after 60 s; last check passed: ${last}`);
    process.exit(1);
  }, 60000);
  body().then(
    () => {
      clearTimeout(timer);
      console.log(`ok: ${checks} checks, ${what}`);
      process.exit(0);
    },
    (e) => {
      console.error(e instanceof CheckFailed ? `${e.message} (${what})` : e);
      console.error(`last check passed: ${last}`);
      process.exit(1);
    },
  );
}

module.exports = { check, eq, waitFor, main };
