// Tests of a runner's graph cache: the key and the hashed signature select the graph (also when
// every hash collides), gf_runner_entry_replays, the counters, LRU eviction and what it releases,
// pinned entries, what drops every graph: disable (whose first reason sticks), reset (which
// recaptures with the probe) and destroy (which releases every handle), and the entry's user slot
// (gf_call_options.served), released through the host whenever its entry goes.
#include "gf_runner.h"
#include "gf_test_fakes.h"
#include "runner_fixture.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using namespace runner_test;

// ---- signatures --------------------------------------------------------------------------

uint64_t ConstantHash(const unsigned char *, size_t) { return 7; }

TEST_F(Runner, EntryReplaysIsMinusOneForAnUnknownSignature) {
  Create();
  Inputs inputs = MakeInputs(1, {4}, 0.0f);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "key", 3, inputs.views.data(), 1), -1);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "other", 5, inputs.views.data(), 1), -1);
}

TEST_F(Runner, KeyIsPartOfTheSignature) {
  Create();
  Inputs inputs = MakeInputs(1, {3}, 1.0f);
  ASSERT_EQ(Call(inputs.views, kDefault, "variant-a").status, GF_OK);
  ASSERT_EQ(Call(inputs.views, kDefault, "variant-b").status, GF_OK);
  ASSERT_EQ(Call(inputs.views, kDefault, "variant-a").status, GF_OK);
  EXPECT_EQ(Stats().captures, 2u);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "variant-a", 9, inputs.views.data(), 1), 2);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "variant-b", 9, inputs.views.data(), 1), 1);
}

TEST_F(Runner, ForcedHashCollisionsStillSelectTheRightGraph) {
  config_.hash_fn = ConstantHash;
  Create();
  Inputs three = MakeInputs(2, {3}, 1.0f);
  Inputs four = MakeInputs(2, {4}, 2.0f);
  Inputs two_by_two = MakeInputs(2, {2, 2}, 3.0f);
  CallExpectingCorrect(three);
  CallExpectingCorrect(four);
  CallExpectingCorrect(two_by_two);
  EXPECT_EQ(Stats().captures, 3u);
  EXPECT_EQ(Stats().graphs, 3u);
  for (int round = 0; round < 2; ++round) {
    Inputs again_four = MakeInputs(2, {4}, 10.0f + round);
    CallExpectingCorrect(again_four);
    Inputs again_three = MakeInputs(2, {3}, -1.0f - round);
    CallExpectingCorrect(again_three);
  }
  EXPECT_EQ(Stats().captures, 3u);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "key", 3, three.views.data(), 2), 3);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "key", 3, four.views.data(), 2), 3);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "key", 3, two_by_two.views.data(), 2), 1);
}

// ---- counters, eviction and pins ---------------------------------------------------------

TEST_F(Runner, CountersFollowCapturesReplaysAndEvictions) {
  config_.max_entries = 2;
  Create();
  Inputs a = MakeInputs(1, {1}, 1.0f);
  Inputs b = MakeInputs(1, {2}, 1.0f);
  Inputs c = MakeInputs(1, {3}, 1.0f);
  CallExpectingCorrect(a);
  CallExpectingCorrect(a);
  CallExpectingCorrect(b);
  CallExpectingCorrect(a); // a is now newer than b
  CallExpectingCorrect(c); // evicts b
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.graphs, 2u);
  EXPECT_EQ(stats.pinned, 0u);
  EXPECT_EQ(stats.captures, 3u);
  EXPECT_EQ(stats.replays, 5u);
  EXPECT_EQ(stats.evictions, 1u);
  EXPECT_EQ(stats.eager_calls, 0u);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "key", 3, b.views.data(), 1), -1);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "key", 3, a.views.data(), 1), 3);
  CallExpectingCorrect(b); // captured again, evicting the oldest
  stats = Stats();
  EXPECT_EQ(stats.captures, 4u);
  EXPECT_EQ(stats.evictions, 2u);
  EXPECT_EQ(stats.graphs, 2u);
}

TEST_F(Runner, EvictionReleasesPoolBytesHandlesAndGraph) {
  config_.max_entries = 1;
  Create();
  int64_t sizes[1] = {8};
  gf_tensor held = gf_fake_host_tensor(&host_, 1, sizes, nullptr);
  Inputs a = MakeInputs(2, {2, 3}, 1.0f);
  Result first = Call(a.views, kDefault, "key", {held});
  ASSERT_EQ(first.status, GF_OK);
  ReleaseResults();
  EXPECT_EQ(Stats().pool_bytes, 3 * 6 * 4);
  // The test's tensor, two static inputs, one static output and the entry's keep-alive handle.
  EXPECT_EQ(host_.live_handles, 1 + 2 + 1 + 1);

  Inputs b = MakeInputs(2, {4}, 1.0f);
  CallExpectingCorrect(b);
  ReleaseResults();
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.evictions, 1u);
  EXPECT_EQ(stats.graphs, 1u);
  EXPECT_EQ(stats.pool_bytes, 3 * 4 * 4);
  EXPECT_EQ(backend_.calls[GF_FAKE_HOOK_RELEASE_GRAPH], 1u);
  EXPECT_EQ(backend_.live_graphs, 1);
  EXPECT_EQ(host_.live_handles, 1 + 2 + 1) << "the evicted entry's handles must be released";
  ReleaseTensor(held);
}

TEST_F(Runner, PinnedEntriesSurviveAndGrowthWarnsOnce) {
  config_.max_entries = 1;
  Create();
  Inputs a = MakeInputs(1, {1}, 1.0f);
  Inputs b = MakeInputs(1, {2}, 1.0f);
  Inputs c = MakeInputs(1, {3}, 1.0f);
  CallExpectingCorrect(a, kPinned);
  EXPECT_EQ(host_.warn_count, 0u);
  CallExpectingCorrect(b, kPinned);
  ASSERT_EQ(host_.warn_count, 1u);
  EXPECT_TRUE(Contains(host_.warnings[0], "pinned")) << host_.warnings[0];
  EXPECT_TRUE(Contains(host_.warnings[0], "max_entries=1")) << host_.warnings[0];
  CallExpectingCorrect(c, kPinned);
  EXPECT_EQ(host_.warn_count, 1u) << "the growth warning is said once";
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.graphs, 3u);
  EXPECT_EQ(stats.pinned, 3u);
  EXPECT_EQ(stats.evictions, 0u);
  EXPECT_EQ(stats.enabled, 1);

  // Unpinned entries come and go; the pinned ones stay.
  Inputs d = MakeInputs(1, {4}, 1.0f);
  Inputs e = MakeInputs(1, {5}, 1.0f);
  CallExpectingCorrect(d);
  CallExpectingCorrect(e); // evicts d, the only unpinned entry
  stats = Stats();
  EXPECT_EQ(stats.graphs, 4u);
  EXPECT_EQ(stats.pinned, 3u);
  EXPECT_EQ(stats.evictions, 1u);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "key", 3, d.views.data(), 1), -1);
  ClearLog();
  Inputs again = MakeInputs(1, {1}, 9.0f);
  CallExpectingCorrect(again);
  EXPECT_EQ(Log(), (Events{"copy_batch(1)", "launch", "copy_batch(1)"}));
  EXPECT_EQ(host_.warn_count, 1u);
}

TEST_F(Runner, PinnedEntryIsNotEvictedWhileUnpinnedOnesAre) {
  config_.max_entries = 2;
  Create();
  Inputs pinned = MakeInputs(1, {1}, 1.0f);
  CallExpectingCorrect(pinned, kPinned);
  for (int64_t size = 2; size < 8; ++size) {
    Inputs other = MakeInputs(1, {size}, 1.0f);
    CallExpectingCorrect(other);
  }
  EXPECT_EQ(Stats().graphs, 2u);
  EXPECT_EQ(Stats().evictions, 5u);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "key", 3, pinned.views.data(), 1), 1);
  EXPECT_EQ(host_.warn_count, 0u);
}

// ---- disable, reset and destroy ----------------------------------------------------------

TEST_F(Runner, DisableRunsEagerAndTheFirstReasonSticks) {
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  ReleaseResults();
  gf_runner_disable(runner_, GF_CAUSE_USER, "user asked: debugging");
  EXPECT_EQ(Reason(), "user asked: debugging");
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 0);
  EXPECT_EQ(stats.graphs, 0u);
  EXPECT_EQ(stats.pool_bytes, 0);
  EXPECT_EQ(backend_.calls[GF_FAKE_HOOK_RELEASE_GRAPH], 1u);
  EXPECT_EQ(host_.live_handles, 0);
  ClearLog();
  CallExpectingCorrect(inputs);
  ExpectEagerOnly(Log());
  EXPECT_EQ(Stats().eager_calls, 1u);
  gf_runner_disable(runner_, GF_CAUSE_USER, "a later reason");
  EXPECT_EQ(Reason(), "user asked: debugging");
}

TEST_F(Runner, DisableWithoutReasonStillSaysDisabled) {
  Create();
  gf_runner_disable(runner_, GF_CAUSE_USER, nullptr);
  EXPECT_EQ(Reason(), "disabled");
  EXPECT_EQ(Stats().enabled, 0);
}

TEST_F(Runner, ResetDropsGraphsAndRecapturesWithTheProbe) {
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  ReleaseResults();
  gf_runner_reset(runner_);
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 1);
  EXPECT_EQ(stats.graphs, 0u);
  EXPECT_EQ(stats.pool_bytes, 0);
  EXPECT_EQ(backend_.live_graphs, 0);
  EXPECT_EQ(host_.live_handles, 0);
  EXPECT_STREQ(gf_runner_disabled_reason(runner_), "");
  ClearLog();
  CallExpectingCorrect(inputs);
  EXPECT_EQ(Log(), (Events{"warmup_begin", "probe_begin", "forward", "probe_end", "forward",
                           "warmup_end", "capture_begin", "forward", "capture_end", "copy_batch(2)",
                           "launch", "copy_batch(1)"}));
  EXPECT_EQ(Stats().captures, 2u);
  EXPECT_EQ(Stats().graphs, 1u);
}

// Note [Recaptures in a row] (gf_runner.h): a watch's drops and first-time states, counted in the
// core, are refused at GF_STALE_LIMIT in a row with no replay between; a replay starts over; a
// drop after no capture is not counted; a reset (the user's) counts nothing.
TEST_F(Runner, WatchDropsWithNoReplayBetweenStopAtTheLimit) {
  Create();
  Inputs inputs = MakeInputs(1, {3}, 1.0f);
  for (int drop = 1; drop < GF_STALE_LIMIT; ++drop) {
    CallExpectingCorrect(inputs); // a capture, thrown away before it replays
    ASSERT_EQ(gf_runner_drop_graphs(runner_), 0) << "drop " << drop;
    EXPECT_EQ(Stats().graphs, 0u);
    EXPECT_EQ(gf_runner_drop_graphs(runner_), 0) << "a drop after no capture is not counted";
  }
  CallExpectingCorrect(inputs);
  EXPECT_EQ(gf_runner_select_state(runner_, 7, 1), 1) << "a state new to the graphs counts too";
  EXPECT_EQ(Stats().graphs, 1u) << "at the limit nothing is dropped: the caller disables";
  EXPECT_EQ(gf_runner_select_state(runner_, 0, 0), 0) << "a state seen before is no drop";
}

TEST_F(Runner, AReplayBetweenWatchDropsStartsTheCountOver) {
  Create();
  Inputs inputs = MakeInputs(1, {3}, 1.0f);
  for (int round = 0; round < 3 * GF_STALE_LIMIT; ++round) {
    CallExpectingCorrect(inputs);
    CallExpectingCorrect(inputs); // a replay
    ASSERT_EQ(gf_runner_select_state(runner_, round + 1, 1), 0) << "round " << round;
    gf_runner_reset(runner_);
  }
  EXPECT_EQ(Stats().enabled, 1);
}

TEST_F(Runner, DestroyReleasesEveryHandleAndGraph) {
  config_.max_entries = 2;
  Create();
  int64_t sizes[1] = {4};
  gf_tensor held = gf_fake_host_tensor(&host_, 1, sizes, nullptr);
  for (int64_t size = 1; size <= 4; ++size) {
    Inputs inputs = MakeInputs(3, {size}, 1.0f);
    ASSERT_EQ(Call(inputs.views, size % 2 ? kPinned : kStaticOutputs, "key", {held}).status, GF_OK);
  }
  EXPECT_GT(host_.live_handles, 1);
  EXPECT_GT(backend_.live_graphs, 0);
  ReleaseResults();
  ReleaseTensor(held);
  EXPECT_GT(host_.live_handles, 0) << "the runner still holds its static buffers";
  DestroyRunner();
  EXPECT_EQ(host_.live_handles, 0);
  EXPECT_EQ(host_.bad_releases, 0u);
  EXPECT_EQ(backend_.live_graphs, 0);
  EXPECT_EQ(backend_.live_states, 0);
  EXPECT_EQ(host_.destroyed, 1);
}

// ---- the entry's user slot --------------------------------------------------------------

// What the host's release_user was given, in order (the fake host's context is the fake host).
std::vector<void *> released_user_data;

void RecordUserRelease(void *, void *user) { released_user_data.push_back(user); }

class EntryUser : public Runner {
protected:
  void SetUp() override {
    Runner::SetUp();
    released_user_data.clear();
  }

  void CreateReleasingUser() {
    gf_host table = gf_fake_host_table(&host_);
    table.release_user = RecordUserRelease;
    ASSERT_EQ(gf_runner_create(&config_, &table, &backend_.table, &runner_, &err_), GF_OK)
        << err_.message;
  }

  // One call that asks which entry served it; the slot (NULL: it ran eager).
  void **CallServed(const Inputs &inputs, const std::string &key) {
    // Neither field as a call leaves it: the call must set both (the fakes have no caller-stream
    // hooks, so no call of theirs is answered from a warm-up).
    gf_served_entry served{reinterpret_cast<void **>(this), 1};
    gf_call_options options = kDefault;
    options.served = &served;
    Result result = Call(inputs.views, options, key);
    EXPECT_EQ(result.status, GF_OK) << result.message;
    EXPECT_EQ(served.from_warm_up, 0);
    return served.user;
  }

  int a_ = 0, b_ = 0, c_ = 0; // user data the tests store: their addresses
};

TEST_F(EntryUser, ACaptureServesAnEmptySlotThatLaterHitsOfItsEntryServeAgain) {
  CreateReleasingUser();
  Inputs inputs = MakeInputs(1, {4}, 1.0f);
  void **captured = CallServed(inputs, "a");
  ASSERT_NE(captured, nullptr);
  EXPECT_EQ(*captured, nullptr) << "a new entry's slot starts empty";
  *captured = &a_;
  void **hit = CallServed(inputs, "a");
  EXPECT_EQ(hit, captured);
  EXPECT_EQ(*hit, &a_);
  void **other = CallServed(inputs, "b");
  ASSERT_NE(other, nullptr);
  EXPECT_NE(other, captured);
  EXPECT_EQ(*other, nullptr);
  EXPECT_EQ(Stats().captures, 2u);
  EXPECT_TRUE(released_user_data.empty());
}

TEST_F(EntryUser, AnEagerCallIsServedByNoEntry) {
  config_.enabled = 0;
  CreateReleasingUser();
  Inputs inputs = MakeInputs(1, {4}, 1.0f);
  EXPECT_EQ(CallServed(inputs, "a"), nullptr);
  EXPECT_EQ(Stats().eager_calls, 1u);
}

TEST_F(EntryUser, EvictionReleasesTheEvictedEntrysData) {
  config_.max_entries = 1;
  CreateReleasingUser();
  Inputs inputs = MakeInputs(1, {4}, 1.0f);
  *CallServed(inputs, "a") = &a_;
  *CallServed(inputs, "b") = &b_;
  EXPECT_EQ(released_user_data, std::vector<void *>{&a_});
  EXPECT_EQ(Stats().evictions, 1u);
}

TEST_F(EntryUser, ResetAndDisableReleaseEveryEntrysData) {
  CreateReleasingUser();
  Inputs inputs = MakeInputs(1, {4}, 1.0f);
  *CallServed(inputs, "a") = &a_;
  *CallServed(inputs, "b") = &b_;
  gf_runner_reset(runner_);
  EXPECT_EQ(released_user_data.size(), 2u);
  *CallServed(inputs, "c") = &c_;
  gf_runner_disable(runner_, GF_CAUSE_USER, "asked");
  EXPECT_EQ(released_user_data.size(), 3u);
  EXPECT_EQ(released_user_data.back(), &c_);
  DestroyRunner();
  EXPECT_EQ(released_user_data.size(), 3u) << "nothing was left to release";
}

TEST_F(EntryUser, DestroyReleasesEveryEntrysData) {
  CreateReleasingUser();
  Inputs inputs = MakeInputs(1, {4}, 1.0f);
  *CallServed(inputs, "a") = &a_;
  *CallServed(inputs, "b") = &b_;
  DestroyRunner();
  EXPECT_EQ(released_user_data.size(), 2u);
}

TEST_F(EntryUser, WithoutReleaseUserTheCoreLeavesTheDataAlone) {
  Create();
  Inputs inputs = MakeInputs(1, {4}, 1.0f);
  *CallServed(inputs, "a") = &a_;
  gf_runner_reset(runner_);
  EXPECT_EQ(Stats().graphs, 0u);
  EXPECT_TRUE(released_user_data.empty());
}

} // namespace
