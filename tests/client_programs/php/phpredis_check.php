<?php
// phpredis (Debian php-redis) against a server on 127.0.0.1, RESP2: transactions, WATCH
// conflicts from a second connection, blocking pops woken by a push from another process,
// pub/sub round trips. Usage: php phpredis_check.php PORT. Prints "ok: N checks ..." and exits
// 0, or prints the first failed check on stderr and exits 1. The pushing and publishing side
// runs in a forked child (PHP has no threads); every wait is bounded.

$port = (int)($argv[1] ?? 0);
$checks = 0;
$last = "(none yet)";

function fail(string $msg): void {
    global $last;
    fwrite(STDERR, "FAIL $msg (phpredis)\nlast check passed: $last\n");
    exit(1);
}

function check(bool $cond, string $what): void {
    global $checks, $last;
    if (!$cond) fail($what);
    $checks++;
    $last = $what;
}

function eq($got, $want, string $what): void {
    if ($got !== $want) {
        fail("$what: got " . var_export($got, true) . ", want " . var_export($want, true));
    }
    check(true, $what);
}

function client(): Redis {
    global $port;
    $r = new Redis();
    if (!$r->connect("127.0.0.1", $port, 10.0)) fail("connect to port $port");
    $r->setOption(Redis::OPT_READ_TIMEOUT, 20.0);
    return $r;
}

// Polls $cond every 10 ms for at most 10 s.
function wait_for(callable $cond, string $what): void {
    $deadline = microtime(true) + 10;
    while (microtime(true) < $deadline) {
        if ($cond()) {
            check(true, $what);
            return;
        }
        usleep(10000);
    }
    fail("$what: not within 10 s");
}

function blocked_clients(Redis $r): int {
    $info = $r->info("clients");
    return (int)($info["blocked_clients"] ?? -1);
}

// Runs $body in a forked child with its own connection; returns the child's pid.
function in_child(callable $body): int {
    $pid = pcntl_fork();
    if ($pid < 0) fail("fork");
    if ($pid === 0) {
        try {
            $body(client());
            exit(0);
        } catch (Throwable $e) {
            fwrite(STDERR, "child: $e\n");
            exit(1);
        }
    }
    return $pid;
}

function join_child(int $pid, string $what): void {
    $deadline = microtime(true) + 20;
    while (microtime(true) < $deadline) {
        $done = pcntl_waitpid($pid, $status, WNOHANG);
        if ($done === $pid) {
            check(pcntl_wifexited($status) && pcntl_wexitstatus($status) === 0, "$what exits 0");
            return;
        }
        usleep(10000);
    }
    posix_kill($pid, SIGKILL);
    pcntl_waitpid($pid, $status);
    fail("$what: still running after 20 s");
}

// Nothing may hang: the whole program has 60 s.
pcntl_async_signals(true);
pcntl_signal(SIGALRM, function () { fail("still running after 60 s"); });
pcntl_alarm(60);

$r = client();
$other = client();
eq($r->flushAll(), true, "flushall");

// --- MULTI/EXEC.
eq($r->multi()->set("t:a", "1")->incr("t:a")->get("t:a")->rPush("t:l", "x", "y")->exec(),
    [true, 2, "2", 2], "multi()->exec() replies");
// A runtime error is that command's reply only: phpredis gives false in its place.
eq($r->multi()->set("t:s", "abc")->incr("t:s")->append("t:s", "d")->exec(),
    [true, false, 4], "a runtime error inside EXEC");
eq($r->get("t:s"), "abcd", "the transaction's writes stay");
// (A command refused while queuing cannot be sent: phpredis checks names and arguments
// itself, and its rawCommand does not queue.)
$r->multi();
$r->set("t:d", "1");
eq($r->discard(), true, "discard");
eq($r->exists("t:d"), 0, "nothing of a discarded transaction ran");
// A pipeline (not a transaction) answers in order too.
eq($r->pipeline()->set("p:1", "a")->get("p:1")->del("p:1")->exec(), [true, "a", 1], "pipeline()");

// --- WATCH: a write from another connection makes EXEC fail.
$r->set("w:k", "0");
eq($r->watch("w:k"), true, "watch");
eq($other->set("w:k", "theirs"), true, "the other connection writes the watched key");
eq($r->multi()->set("w:k", "mine")->exec(), false, "EXEC after a conflict fails");
eq($r->get("w:k"), "theirs", "the conflicting transaction wrote nothing");
$r->watch("w:k");
eq($r->multi()->set("w:k", "mine")->exec(), [true], "EXEC without a conflict");
eq($r->get("w:k"), "mine", "and it wrote");
// WATCH-guarded increments racing a child process doing the same: none lost.
$r->set("w:n", "0");
$cas = function (Redis $c, int $times): int {
    $retries = 0;
    for ($i = 0; $i < $times; $i++) {
        for (;;) {
            $c->watch("w:n");
            $n = (int)$c->get("w:n");
            if ($c->multi()->set("w:n", (string)($n + 1))->exec() !== false) break;
            $retries++;
        }
    }
    return $retries;
};
$pid = in_child(function (Redis $c) use ($cas) { $cas($c, 50); });
$cas($r, 50);
join_child($pid, "the racing child");
eq($r->get("w:n"), "100", "WATCH-guarded increments from two processes lose nothing");

// --- Blocking pops.
$r->rPush("b:q", "j1");
eq($r->blPop(["b:none", "b:q"], 1), ["b:q", "j1"], "blPop with data answers at once");
eq($r->blPop(["b:q"], 1), [], "blPop times out empty");
$pid = in_child(function (Redis $c) {
    $deadline = microtime(true) + 10;
    while (blocked_clients($c) !== 1 && microtime(true) < $deadline) usleep(10000);
    $c->lPush("b:q", "j2");
});
eq($r->brPop(["b:q"], 10), ["b:q", "j2"], "brPop woken by a push from another process");
join_child($pid, "the pushing child");
eq($r->exists("b:q"), 0, "the waiter took the element");
$pid = in_child(function (Redis $c) {
    $deadline = microtime(true) + 10;
    while (blocked_clients($c) !== 1 && microtime(true) < $deadline) usleep(10000);
    $c->rPush("b:src", "m1");
});
eq($r->brpoplpush("b:src", "b:dst", 10), "m1", "brpoplpush woken by a push");
join_child($pid, "the second pushing child");
eq($r->lRange("b:dst", 0, -1), ["m1"], "brpoplpush moved it");

// --- Pub/sub round trips: a child publishes once the subscription is in place. phpredis's
// subscribe loop has no way out but the connection's end: the callback closes it, and
// subscribe() then throws "Connection closed".
$publish_when = function (string $channel, string $msg, callable $ready): int {
    return in_child(function (Redis $c) use ($channel, $msg, $ready) {
        $deadline = microtime(true) + 10;
        while (!$ready($c) && microtime(true) < $deadline) usleep(10000);
        // Nobody else listens: exactly one receiver.
        exit($c->publish($channel, $msg) === 1 ? 0 : 2);
    });
};
$until_closed = function (callable $loop, string $what) {
    try {
        $loop();
        fail("$what returned without the callback");
    } catch (RedisException $e) {
        check($e->getMessage() === "Connection closed", "$what ends by the callback: " . $e->getMessage());
    }
};
$sub = client();
$pid = $publish_when("ps:news", "hello",
    fn (Redis $c) => ($c->pubsub("numsub", ["ps:news"])["ps:news"] ?? 0) === 1);
$got = [];
$until_closed(function () use ($sub, &$got) {
    $sub->subscribe(["ps:news"], function ($redis, $chan, $msg) use (&$got) {
        $got[] = [$chan, $msg];
        $redis->close();
    });
}, "subscribe");
join_child($pid, "the publishing child");
eq($got, [["ps:news", "hello"]], "the channel message");
$psub = client();
$pid = $publish_when("ps:p.1", "patterned", fn (Redis $c) => $c->pubsub("numpat") === 1);
$pgot = [];
$until_closed(function () use ($psub, &$pgot) {
    $psub->psubscribe(["ps:p.*"], function ($redis, $pat, $chan, $msg) use (&$pgot) {
        $pgot[] = [$pat, $chan, $msg];
        $redis->close();
    });
}, "psubscribe");
join_child($pid, "the pattern publisher");
eq($pgot, [["ps:p.*", "ps:p.1", "patterned"]], "the pattern message");
wait_for(fn () => $r->pubsub("numpat") === 0 && ($r->pubsub("numsub", ["ps:news"])["ps:news"] ?? -1) === 0,
    "closed subscribers leave no subscription behind");
eq($r->publish("ps:nobody", "lost"), 0, "publish to nobody");

pcntl_alarm(0);
echo "ok: $checks checks, phpredis " . phpversion("redis") . " protocol 2\n";
exit(0);
