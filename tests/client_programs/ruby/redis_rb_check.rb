# redis-rb (Debian ruby-redis, 4.x: RESP2) against a server on 127.0.0.1: transactions, WATCH
# conflicts from a second connection, blocking pops woken by a push from another thread's
# connection, pub/sub round trips. Usage: ruby redis_rb_check.rb PORT. Prints "ok: N checks
# ..." and exits 0, or prints the first failed check on stderr and exits 1.
require "redis"
require "timeout"

PORT = Integer(ARGV.fetch(0))
$checks = 0
$last = "(none yet)"

class CheckFailed < StandardError; end

def check(cond, what)
  raise CheckFailed, "FAIL #{what}" unless cond
  $checks += 1
  $last = what
end

def eq(got, want, what)
  check(got == want, "#{what}: got #{got.inspect}, want #{want.inspect}")
end

def client
  Redis.new(host: "127.0.0.1", port: PORT, timeout: 20, reconnect_attempts: 0)
end

# Polls the block every 10 ms for at most 10 s.
def wait_for(what)
  deadline = Time.now + 10
  until yield
    raise CheckFailed, "FAIL #{what}: not within 10 s" if Time.now > deadline
    sleep 0.01
  end
  check(true, what)
end

def blocked_clients(r)
  Integer(r.info("clients").fetch("blocked_clients"))
end

# A thread's value, waiting at most 20 s for it.
def joined(thread, what)
  raise CheckFailed, "FAIL #{what}: still running after 20 s" unless thread.join(20)
  thread.value
end

begin
  Timeout.timeout(60) do
    r = client
    other = client
    eq(r.flushall, "OK", "flushall")

    # --- MULTI/EXEC.
    eq(r.multi { |t| t.set("t:a", "1"); t.incr("t:a"); t.get("t:a"); t.rpush("t:l", %w[x y]) },
       ["OK", 2, "2", 2], "multi replies")
    # A runtime error inside EXEC: redis-rb raises it after the transaction ran.
    err = nil
    begin
      r.multi { |t| t.set("t:s", "abc"); t.incr("t:s"); t.append("t:s", "d") }
    rescue Redis::CommandError => e
      err = e
    end
    check(err && err.message.include?("not an integer"), "INCR of a string fails inside EXEC: #{err.inspect}")
    eq(r.get("t:s"), "abcd", "the other commands of the transaction ran")
    # A command refused while queuing discards the transaction.
    aborted = nil
    begin
      r.multi { |t| t.set("t:never", "1"); t.call("NOSUCHCOMMAND") }
    rescue Redis::CommandError => e
      aborted = e
    end
    check(aborted && aborted.message =~ /EXECABORT|unknown command/, "a queuing error aborts: #{aborted.inspect}")
    eq(r.exists("t:never"), 0, "a discarded transaction wrote nothing")
    # A pipeline (not a transaction) answers in order too.
    eq(r.pipelined { |p| p.set("p:1", "a"); p.get("p:1"); p.del("p:1") }, ["OK", "a", 1], "pipelined")

    # --- WATCH: a write from another connection makes EXEC answer nil.
    r.set("w:k", "0")
    res = r.watch("w:k") do
      eq(other.set("w:k", "theirs"), "OK", "the other connection writes the watched key")
      r.multi { |t| t.set("w:k", "mine") }
    end
    eq(res, nil, "EXEC after a conflict is nil")
    eq(r.get("w:k"), "theirs", "the conflicting transaction wrote nothing")
    res = r.watch("w:k") { r.multi { |t| t.set("w:k", "mine") } }
    eq(res, ["OK"], "EXEC without a conflict")
    eq(r.get("w:k"), "mine", "and it wrote")
    # WATCH-guarded increments from two connections in two threads: none lost.
    r.set("w:n", "0")
    cas = lambda do |c, times|
      times.times do
        loop do
          done = c.watch("w:n") do
            n = Integer(c.get("w:n"))
            c.multi { |t| t.set("w:n", (n + 1).to_s) }
          end
          break if done
        end
      end
    end
    racer = Thread.new { cas.call(client, 25) }
    cas.call(r, 25)
    joined(racer, "the racing thread")
    eq(r.get("w:n"), "50", "WATCH-guarded increments from two connections lose nothing")

    # --- Blocking pops.
    r.rpush("b:q", "j1")
    eq(r.blpop(["b:none", "b:q"], timeout: 1), ["b:q", "j1"], "blpop with data answers at once")
    eq(r.blpop("b:q", timeout: 0.05), nil, "blpop times out with nil")
    waiter = client
    t = Thread.new { waiter.brpop("b:q", timeout: 10) }
    wait_for("the waiter is blocked") { blocked_clients(other) == 1 }
    eq(other.lpush("b:q", "j2"), 1, "lpush from another connection")
    eq(joined(t, "the brpop thread"), ["b:q", "j2"], "brpop woken by the push")
    eq(r.exists("b:q"), 0, "the waiter took the element")
    t = Thread.new { waiter.brpoplpush("b:src", "b:dst", timeout: 10) }
    wait_for("the brpoplpush waiter is blocked") { blocked_clients(other) == 1 }
    other.rpush("b:src", "m1")
    eq(joined(t, "the brpoplpush thread"), "m1", "brpoplpush woken by the push")
    eq(r.lrange("b:dst", 0, -1), ["m1"], "brpoplpush moved it")
    t = Thread.new { waiter.bzpopmin("b:z", timeout: 10) }
    wait_for("the bzpopmin waiter is blocked") { blocked_clients(other) == 1 }
    other.zadd("b:z", [[2, "two"], [1, "one"]])
    eq(joined(t, "the bzpopmin thread"), ["b:z", "one", 1.0], "bzpopmin woken by zadd")

    # --- Pub/sub round trips: a thread publishes once the subscription is in place; the
    # subscriber unsubscribes from inside its handler, which ends the subscribe block.
    publish_when = lambda do |channel, msg, &ready|
      Thread.new do
        c = client
        deadline = Time.now + 10
        sleep 0.01 until ready.call(c) || Time.now > deadline
        c.publish(channel, msg)
      end
    end
    sub = client
    got = []
    publisher = publish_when.call("ps:news", "hello") { |c| c.pubsub("numsub", "ps:news") == ["ps:news", 1] }
    sub.subscribe("ps:news") do |on|
      on.message do |ch, msg|
        got << [ch, msg]
        sub.unsubscribe
      end
    end
    eq(joined(publisher, "the publisher"), 1, "the publish reached one subscriber")
    eq(got, [["ps:news", "hello"]], "the channel message")
    pgot = []
    publisher = publish_when.call("ps:p.1", "patterned") { |c| c.pubsub("numpat") == 1 }
    sub.psubscribe("ps:p.*") do |on|
      on.pmessage do |pat, ch, msg|
        pgot << [pat, ch, msg]
        sub.punsubscribe
      end
    end
    eq(joined(publisher, "the pattern publisher"), 1, "the publish reached the pattern")
    eq(pgot, [["ps:p.*", "ps:p.1", "patterned"]], "the pattern message")
    eq(sub.ping, "PONG", "the connection is ordinary again after unsubscribing")
    eq(r.publish("ps:news", "after"), 0, "no subscriber after unsubscribe")
    eq(r.pubsub("numpat"), 0, "no pattern left")
  end
rescue CheckFailed => e
  warn "#{e.message} (redis-rb #{Redis::VERSION})"
  warn "last check passed: #{$last}"
  exit 1
rescue Timeout::Error
  warn "FAIL still running after 60 s (redis-rb #{Redis::VERSION}); last check passed: #{$last}"
  exit 1
end
puts "ok: #{$checks} checks, redis-rb #{Redis::VERSION} protocol 2"
