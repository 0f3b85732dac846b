// Tests for gf_runner driven through the recording backend and the malloc host: the capture
// protocol and its order, replay with batched input copies, LRU eviction and pins, every way a
// runner ends up eager (failures, disagreement, disable, config, no backend, outer capture), the
// output modes, and that every host handle and graph is released in the end.
#include "gf_backend_registry.h"
#include "gf_runner.h"
#include "gf_test_fakes.h"
#include "runner_fixture.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using namespace runner_test;

uint64_t ConstantHash(const unsigned char *, size_t) { return 7; }

// ---- capture and replay ------------------------------------------------------------------

TEST_F(Runner, FirstCallCapturesInProtocolOrderThenReplays) {
  config_.warmup_iters = 3;
  Create();
  EXPECT_STREQ(gf_runner_backend_name(runner_), "fake");
  EXPECT_STREQ(gf_runner_disabled_reason(runner_), "");
  Inputs inputs = MakeInputs(2, {2, 3}, 1.0f);
  CallExpectingCorrect(inputs);
  // The sync probe is the first of the warm-ups on the side stream.
  EXPECT_EQ(Log(), (Events{"warmup_begin", "probe_begin", "forward", "probe_end", "forward",
                           "forward", "warmup_end", "capture_begin", "forward", "capture_end",
                           "copy_batch(2)", "launch", "copy_batch(1)"}));
  EXPECT_EQ(host_.forward_calls, 4u);
  // With a process group the ranks meet before the live warm-ups, after each, and after the
  // capture: the counts of forwards run before each agreement.
  ASSERT_EQ(host_.agree_calls, 5u);
  for (uint64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(host_.forwards_at_agreement[i], i) << "agreement " << i;
    EXPECT_EQ(host_.ok_at_agreement[i], 1) << "agreement " << i;
  }
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 1);
  EXPECT_EQ(stats.graphs, 1u);
  EXPECT_EQ(stats.captures, 1u);
  EXPECT_EQ(stats.replays, 1u);
  EXPECT_EQ(stats.eager_calls, 0u);
  EXPECT_EQ(stats.pool_bytes, 3 * 6 * 4); // two static inputs and one output of 6 floats
  EXPECT_EQ(backend_.live_graphs, 1);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "key", 3, inputs.views.data(), 2), 1);
}

TEST_F(Runner, SecondCallWithNewValuesReplaysWithoutCapture) {
  Create();
  Inputs first = MakeInputs(2, {2, 3}, 1.0f);
  CallExpectingCorrect(first);
  ClearLog();
  uint64_t forwards = host_.forward_calls;
  Inputs second = MakeInputs(2, {2, 3}, -7.5f);
  CallExpectingCorrect(second);
  EXPECT_EQ(Log(), (Events{"copy_batch(2)", "launch", "copy_batch(1)"}));
  EXPECT_EQ(host_.forward_calls, forwards) << "a replay must not run the forward";
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.captures, 1u);
  EXPECT_EQ(stats.replays, 2u);
  EXPECT_EQ(stats.graphs, 1u);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "key", 3, second.views.data(), 2), 2);
  // And a third time, back to the first values.
  CallExpectingCorrect(first);
  EXPECT_EQ(Stats().replays, 3u);
}

TEST_F(Runner, EntryReplaysIsMinusOneForAnUnknownSignature) {
  Create();
  Inputs inputs = MakeInputs(1, {4}, 0.0f);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "key", 3, inputs.views.data(), 1), -1);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(gf_runner_entry_replays(runner_, "other", 5, inputs.views.data(), 1), -1);
}

// The hook calls of one replay with `count` inputs, and the size of its input batch.
struct ReplayCost {
  uint64_t hook_calls;
  Events log;
};

class RunnerInputCount : public Runner {
protected:
  ReplayCost MeasureReplay(size_t count) {
    Create();
    Inputs warm = MakeInputs(count, {3}, 0.0f);
    CallExpectingCorrect(warm);
    ClearLog();
    uint64_t before = ReplayHookCalls();
    Inputs inputs = MakeInputs(count, {3}, 2.0f);
    CallExpectingCorrect(inputs);
    return {ReplayHookCalls() - before, Log()};
  }
};

TEST_F(RunnerInputCount, FourInputsCopyInOneBatch) {
  ReplayCost cost = MeasureReplay(4);
  EXPECT_EQ(cost.log, (Events{"copy_batch(4)", "launch", "copy_batch(1)"}));
  EXPECT_EQ(cost.hook_calls, 3u);
}

TEST_F(RunnerInputCount, SixtyFourInputsCostTheSameLaunches) {
  ReplayCost cost = MeasureReplay(64);
  EXPECT_EQ(cost.log, (Events{"copy_batch(64)", "launch", "copy_batch(1)"}));
  EXPECT_EQ(cost.hook_calls, 3u) << "launches per replay must not grow with the input count";
}

TEST_F(Runner, InputAlreadyInTheStaticBufferIsNotCopied) {
  Create();
  Inputs first = MakeInputs(2, {4}, 1.0f);
  CallExpectingCorrect(first);
  ASSERT_EQ(host_.clone_calls, 2u);
  gf_tensor static_a = host_.clones[0];
  gf_tensor static_b = host_.clones[1];
  EXPECT_NE(static_a.data, first.views[0].data);

  // The caller writes input 0 straight into its static buffer and passes that buffer.
  float *a = static_cast<float *>(static_a.data);
  for (int e = 0; e < 4; ++e) {
    a[e] = 100.0f + e;
  }
  Inputs b = MakeInputs(1, {4}, -3.0f);
  std::vector<gf_tensor> mixed = {static_a, b.views[0]};
  ClearLog();
  Result result = Call(mixed);
  ASSERT_EQ(result.status, GF_OK);
  EXPECT_EQ(Log(), (Events{"copy_batch(1)", "launch", "copy_batch(1)"}));
  EXPECT_EQ(result.values[0], Expected(mixed));
  EXPECT_EQ(result.values[0][0], 2 * 100.0f - 3.0f);

  // Both in place: no input copy at all.
  float *static_b_data = static_cast<float *>(static_b.data);
  static_b_data[0] = 1000.0f;
  ClearLog();
  result = Call({static_a, static_b});
  ASSERT_EQ(result.status, GF_OK);
  EXPECT_EQ(Log(), (Events{"launch", "copy_batch(1)"}));
  EXPECT_EQ(result.values[0][0], 2 * 100.0f + 1000.0f);
}

TEST_F(Runner, SameAddressButDifferentStridesIsCopied) {
  Create();
  Inputs first = MakeInputs(1, {2, 1}, 1.0f);
  CallExpectingCorrect(first);
  gf_tensor same_place = host_.clones[0];
  same_place.strides[1] = 5; // still contiguous (size-1 dim) but not the same view
  ClearLog();
  Result result = Call({same_place});
  ASSERT_EQ(result.status, GF_OK);
  EXPECT_EQ(Log(), (Events{"copy_batch(1)", "launch", "copy_batch(1)"}));
}

TEST_F(Runner, NewShapeCapturesAgainWithoutProbeAndOneWarmup) {
  config_.warmup_iters = 3;
  Create();
  Inputs small = MakeInputs(2, {2, 3}, 1.0f);
  CallExpectingCorrect(small);
  ClearLog();
  Inputs large = MakeInputs(2, {5}, 4.0f);
  CallExpectingCorrect(large);
  EXPECT_EQ(Log(), (Events{"warmup_begin", "forward", "warmup_end", "capture_begin", "forward",
                           "capture_end", "copy_batch(2)", "launch", "copy_batch(1)"}));
  EXPECT_EQ(Stats().captures, 2u);
  EXPECT_EQ(Stats().graphs, 2u);
  ClearLog();
  CallExpectingCorrect(small); // the first graph is still there
  EXPECT_EQ(Log(), (Events{"copy_batch(2)", "launch", "copy_batch(1)"}));
}

TEST_F(Runner, ZeroWarmupItersSkipsTheSideStream) {
  config_.warmup_iters = 0;
  Create();
  Inputs small = MakeInputs(1, {3}, 1.0f);
  CallExpectingCorrect(small);
  // The probe runs all the same, as the one warm-up of the first capture.
  EXPECT_EQ(Log(), (Events{"warmup_begin", "probe_begin", "forward", "probe_end", "warmup_end",
                           "capture_begin", "forward", "capture_end", "copy_batch(1)", "launch",
                           "copy_batch(1)"}));
  ClearLog();
  Inputs large = MakeInputs(1, {4}, 1.0f);
  CallExpectingCorrect(large);
  EXPECT_EQ(Log(), (Events{"capture_begin", "forward", "capture_end", "copy_batch(1)", "launch",
                           "copy_batch(1)"}));
}

TEST_F(Runner, NegativeWarmupItersIsRejected) {
  config_.warmup_iters = -1;
  EXPECT_EQ(Create(&backend_.table), GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(runner_, nullptr);
  EXPECT_TRUE(Contains(err_.message, "warmup_iters")) << err_.message;
  EXPECT_EQ(host_.destroyed, 1);
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

TEST_F(Runner, EveryOutputOfAMultiOutputForwardIsReplayed) {
  host_.output_count = 2;
  Create();
  Inputs first = MakeInputs(1, {3}, 1.0f);
  Result result = Call(first.views);
  ASSERT_EQ(result.status, GF_OK);
  ASSERT_EQ(result.values.size(), 2u);
  EXPECT_EQ(result.values[0], Expected(first.views, 0));
  EXPECT_EQ(result.values[1], Expected(first.views, 1));
  EXPECT_EQ(Stats().pool_bytes, 3 * 3 * 4);
  ClearLog();
  Inputs second = MakeInputs(1, {3}, 5.0f);
  result = Call(second.views);
  ASSERT_EQ(result.values.size(), 2u);
  EXPECT_EQ(result.values[0], Expected(second.views, 0));
  EXPECT_EQ(result.values[1], Expected(second.views, 1));
  EXPECT_EQ(Log(), (Events{"copy_batch(1)", "launch", "copy_batch(2)"}));
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

// ---- failures disable the runner ---------------------------------------------------------

class RunnerFailingHook : public Runner, public ::testing::WithParamInterface<gf_fake_hook> {};

TEST_P(RunnerFailingHook, FirstCallDisablesAndStillReturnsTheEagerResult) {
  gf_fake_hook hook = GetParam();
  std::string message = std::string("boom in ") + gf_fake_hook_name(hook);
  gf_fake_backend_fail(&backend_, hook, 0, message.c_str());
  Create();
  Inputs first = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(first);

  bool during_replay = hook == GF_FAKE_HOOK_COPY_BATCH || hook == GF_FAKE_HOOK_LAUNCH;
  std::string reason = Reason();
  EXPECT_TRUE(Contains(reason, message)) << reason;
  EXPECT_EQ(reason.rfind(during_replay ? "replay failed: " : "capture failed: ", 0), 0u) << reason;
  EXPECT_EQ(host_.last_agree_ok, during_replay ? 1 : 0) << "every rank must learn of the failure";
  EXPECT_GE(host_.warn_count, 1u);
  EXPECT_TRUE(Contains(LastWarning(), message)) << LastWarning();
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 0);
  EXPECT_EQ(stats.graphs, 0u);
  EXPECT_EQ(stats.pool_bytes, 0);
  EXPECT_EQ(stats.eager_calls, 1u);
  EXPECT_EQ(backend_.live_graphs, 0);

  // Later calls run eager even when the hook would work again.
  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_NONE, 0, nullptr);
  ClearLog();
  Inputs second = MakeInputs(2, {3}, 8.0f);
  CallExpectingCorrect(second);
  ExpectEagerOnly(Log());
  EXPECT_EQ(Stats().eager_calls, 2u);
  EXPECT_EQ(Stats().captures, during_replay ? 1u : 0u);
  EXPECT_EQ(Reason(), reason);
}

INSTANTIATE_TEST_SUITE_P(EveryHook, RunnerFailingHook,
                         ::testing::Values(GF_FAKE_HOOK_PROBE_BEGIN, GF_FAKE_HOOK_PROBE_END,
                                           GF_FAKE_HOOK_WARMUP_BEGIN, GF_FAKE_HOOK_WARMUP_END,
                                           GF_FAKE_HOOK_CAPTURE_BEGIN, GF_FAKE_HOOK_CAPTURE_END,
                                           GF_FAKE_HOOK_COPY_BATCH, GF_FAKE_HOOK_LAUNCH),
                         [](const ::testing::TestParamInfo<gf_fake_hook> &info) {
                           return std::string(gf_fake_hook_name(info.param));
                         });

TEST_F(Runner, CaptureEndFailingOnALaterCaptureDropsEveryGraph) {
  Create();
  Inputs a = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(a);
  ReleaseResults();
  EXPECT_EQ(backend_.live_graphs, 1);
  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_CAPTURE_END, 0, "instantiate ran out of memory");
  Inputs b = MakeInputs(2, {4}, 1.0f);
  ClearLog();
  CallExpectingCorrect(b);
  EXPECT_EQ(Log(), (Events{"warmup_begin", "forward", "warmup_end", "capture_begin", "forward",
                           "capture_end", "release_graph", "forward"}));
  EXPECT_TRUE(Contains(Reason(), "instantiate ran out of memory")) << Reason();
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 0);
  EXPECT_EQ(stats.graphs, 0u);
  EXPECT_EQ(stats.pool_bytes, 0);
  EXPECT_EQ(stats.captures, 1u);
  EXPECT_EQ(backend_.live_graphs, 0);
  ReleaseResults();
  EXPECT_EQ(host_.live_handles, 0) << "dropped graphs give back their static buffers";
  // The shape that had a graph runs eager now.
  ClearLog();
  CallExpectingCorrect(a);
  ExpectEagerOnly(Log());
  EXPECT_EQ(Stats().eager_calls, 2u);
}

TEST_F(Runner, ForwardFailingDuringCaptureDisables) {
  host_.fail_forward_while_capturing = 1;
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(Log(), (Events{"warmup_begin", "probe_begin", "forward", "probe_end", "forward",
                           "warmup_end", "capture_begin", "forward", "capture_end", "forward"}))
      << "capture_end must close the capture also when the forward failed";
  EXPECT_TRUE(Contains(Reason(), "fake forward failed during capture")) << Reason();
  EXPECT_EQ(host_.last_agree_ok, 0);
  EXPECT_EQ(Stats().enabled, 0);
  EXPECT_EQ(Stats().eager_calls, 1u);
  EXPECT_EQ(Stats().captures, 0u);
}

TEST_F(Runner, LaunchFailingOnALaterReplayDisables) {
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_LAUNCH, 0, "device lost");
  Inputs next = MakeInputs(2, {3}, 3.0f);
  ClearLog();
  CallExpectingCorrect(next);
  EXPECT_EQ(Log(), (Events{"copy_batch(2)", "launch", "release_graph", "forward"}));
  EXPECT_EQ(Reason(), "replay failed: device lost");
  EXPECT_EQ(Stats().replays, 1u);
  EXPECT_EQ(Stats().eager_calls, 1u);
  EXPECT_EQ(Stats().graphs, 0u);
}

TEST_F(Runner, OutputCopyFailingReleasesThePartialResults) {
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  // The input batch succeeds, the output batch fails after its clone was made.
  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_COPY_BATCH, 1, "copy engine hung");
  Inputs next = MakeInputs(2, {3}, 3.0f);
  Result result = Call(next.views);
  ASSERT_EQ(result.status, GF_OK);
  ASSERT_EQ(result.values.size(), 1u) << "only the eager output is returned";
  EXPECT_EQ(result.values[0], Expected(next.views));
  EXPECT_TRUE(Contains(Reason(), "copy engine hung")) << Reason();
  ReleaseResults();
  EXPECT_EQ(host_.live_handles, 0);
}

TEST_F(Runner, WithoutAGroupNoAgreementIsAsked) {
  host_.no_group = 1;
  config_.warmup_iters = 3;
  Create();
  Inputs inputs = MakeInputs(2, {2, 3}, 1.0f);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(host_.agree_calls, 0u);
  EXPECT_EQ(Stats().captures, 1u);
  EXPECT_EQ(host_.forward_calls, 4u);
}

TEST_F(Runner, AnotherRankFailingItsProbeStopsTheWarmUpsOnThisRankToo) {
  host_.agree_forced = 1;
  host_.agree_value = 0;
  host_.agree_forced_from = 2; // the agreement after the probe
  config_.warmup_iters = 3;
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  // No live forward after the one every rank ran: the warm-ups and the capture are skipped.
  EXPECT_EQ(Log(), (Events{"warmup_begin", "probe_begin", "forward", "probe_end", "warmup_end",
                           "forward"}));
  EXPECT_EQ(host_.agree_calls, 3u) << "before the warm-ups, after the probe, and the final one";
  EXPECT_TRUE(Contains(Reason(), "another rank of the process group failed in its sync probe"))
      << Reason();
  EXPECT_EQ(Stats().enabled, 0);
  EXPECT_EQ(Stats().captures, 0u);
  EXPECT_EQ(backend_.live_graphs, 0);
}

TEST_F(Runner, AWarmUpFailingOnThisRankStopsBeforeAnyFurtherLiveForward) {
  host_.fail_forward_number = 2; // the warm-up after the probe
  config_.warmup_iters = 3;
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  ASSERT_EQ(host_.agree_calls, 4u);
  const uint64_t forwards[] = {0, 1, 2, 2};
  const int oks[] = {1, 1, 0, 0};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(host_.forwards_at_agreement[i], forwards[i]) << "agreement " << i;
    EXPECT_EQ(host_.ok_at_agreement[i], oks[i]) << "agreement " << i;
  }
  EXPECT_TRUE(Contains(Reason(), "fake forward failed")) << Reason();
  EXPECT_EQ(Stats().enabled, 0);
  EXPECT_EQ(host_.forward_calls, 3u) << "probe, the failing warm-up, then the eager run";
}

TEST_F(Runner, TheForwardsOwnErrorInAWarmUpIsAFailureOfTheGroup) {
  host_.fail_forward_number = 2; // the warm-up after the probe
  host_.forward_error_is_own = 1;
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs); // the eager run after the disable
  EXPECT_EQ(Stats().enabled, 0) << "with a group every rank disables together";
  EXPECT_EQ(host_.last_agree_ok, 0);
}

TEST_F(Runner, TheForwardsOwnErrorWithoutAGroupIsTheCallersAndKeepsTheRunner) {
  host_.no_group = 1;
  host_.fail_forward_number = 2;
  host_.forward_error_is_own = 1;
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  Result result = Call(inputs.views);
  EXPECT_EQ(result.status, GF_ERR_FORWARD);
  EXPECT_EQ(Stats().enabled, 1);
}

TEST_F(Runner, ASideStreamFailingOnThisRankIsAgreedBeforeAnyLiveForward) {
  host_.agree_forced = 1;
  host_.agree_value = 0; // the peers learn that this rank failed; so does this rank
  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_WARMUP_BEGIN, 0, "no side stream");
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  ASSERT_EQ(host_.agree_calls, 2u);
  EXPECT_EQ(host_.forwards_at_agreement[0], 0u);
  EXPECT_EQ(host_.ok_at_agreement[0], 0);
  EXPECT_EQ(host_.forward_calls, 1u) << "only the eager run";
  EXPECT_TRUE(Contains(Reason(), "no side stream")) << Reason();
}

TEST_F(Runner, AnotherRankFailingDisables) {
  host_.agree_forced = 1;
  host_.agree_value = 0;
  host_.agree_forced_from = 5; // the final agreement, after the capture
  config_.warmup_iters = 3;
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(host_.last_agree_ok, 1) << "this rank's own capture succeeded";
  EXPECT_TRUE(Contains(Reason(), "another rank")) << Reason();
  EXPECT_TRUE(Contains(LastWarning(), "another rank")) << LastWarning();
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 0);
  EXPECT_EQ(stats.graphs, 0u);
  EXPECT_EQ(stats.captures, 0u);
  EXPECT_EQ(stats.eager_calls, 1u);
  EXPECT_EQ(backend_.live_graphs, 0) << "the graph this rank captured is released";
  ClearLog();
  CallExpectingCorrect(inputs);
  ExpectEagerOnly(Log());
}

TEST_F(Runner, AgreementErrorCountsAsFailure) {
  host_.agree_forced = 1;
  host_.agree_value = -1; // the collective itself failed
  Create();
  Inputs inputs = MakeInputs(1, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(Stats().enabled, 0);
  EXPECT_TRUE(Contains(Reason(), "the agreement across the process group failed")) << Reason();
  EXPECT_EQ(host_.forward_calls, 1u) << "the first agreement failed: no live warm-up ran";
}

TEST_F(Runner, FailedRunnerCreateHookDisables) {
  gf_fake_backend_fail(&backend_, GF_FAKE_HOOK_RUNNER_CREATE, 0, "no stream available");
  Create();
  EXPECT_EQ(Reason(), "no stream available");
  Inputs inputs = MakeInputs(1, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  ExpectEagerOnly(Log());
  EXPECT_EQ(Stats().eager_calls, 1u);
}

TEST_F(Runner, EagerForwardFailureIsReturned) {
  config_.enabled = 0;
  host_.fail_forward = 1;
  Create();
  Inputs inputs = MakeInputs(1, {3}, 1.0f);
  Result result = Call(inputs.views);
  EXPECT_EQ(result.status, GF_ERR_BACKEND);
  EXPECT_TRUE(Contains(result.message, "fake forward failed")) << result.message;
  EXPECT_TRUE(result.values.empty());
}

// ---- disable, reset and the ways a runner starts eager -----------------------------------

TEST_F(Runner, DisableRunsEagerAndTheFirstReasonSticks) {
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  ReleaseResults();
  gf_runner_disable(runner_, "user asked: debugging");
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
  gf_runner_disable(runner_, "a later reason");
  EXPECT_EQ(Reason(), "user asked: debugging");
}

TEST_F(Runner, DisableWithoutReasonStillSaysDisabled) {
  Create();
  gf_runner_disable(runner_, nullptr);
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

TEST_F(Runner, EnabledFalseRunsEagerWithReason) {
  config_.enabled = 0;
  Create();
  EXPECT_EQ(Reason(), "disabled by the caller (enabled=False)");
  EXPECT_EQ(backend_.calls[GF_FAKE_HOOK_RUNNER_CREATE], 0u);
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(Log(), (Events{"forward", "forward"}));
  EXPECT_EQ(Stats().eager_calls, 2u);
  EXPECT_EQ(Stats().enabled, 0);
  EXPECT_EQ(Stats().captures, 0u);
}

TEST_F(Runner, NoneBackendIsUnavailableWithItsOwnReason) {
  gf_backend_none_set_reason("the test machine has no device");
  ASSERT_EQ(Create(gf_backend_none()), GF_OK);
  std::string reason = Reason();
  EXPECT_EQ(reason, "graphs unavailable (backend none): the test machine has no device");
  EXPECT_STREQ(gf_runner_backend_name(runner_), "none");
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  EXPECT_EQ(Stats().eager_calls, 1u);
  EXPECT_EQ(Stats().enabled, 0);
}

TEST_F(Runner, DefaultBackendWithNothingRegisteredIsNone) {
  gf_backend_choose(); // the core tests register no backend
  ASSERT_EQ(Create(nullptr), GF_OK);
  EXPECT_STREQ(gf_runner_backend_name(runner_), "none");
  EXPECT_EQ(Reason(), "graphs unavailable (backend none): no graph-capable device: graphed was "
                      "built with no device backend")
      << Reason();
  Inputs inputs = MakeInputs(1, {3}, 1.0f);
  CallExpectingCorrect(inputs);
}

TEST_F(Runner, UnsupportedDeviceIsUnavailable) {
  backend_.supported = 0;
  Create();
  EXPECT_EQ(Reason(),
            "graphs unavailable (backend fake): the fake backend was told graphs are unsupported");
  EXPECT_EQ(backend_.calls[GF_FAKE_HOOK_RUNNER_CREATE], 0u);
}

TEST_F(Runner, OuterCaptureRunsEagerWithoutDisabling) {
  Create();
  backend_.outer_capture_active = 1;
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  CallExpectingCorrect(inputs);
  ExpectEagerOnly(Log());
  gf_runner_stats stats = Stats();
  EXPECT_EQ(stats.enabled, 1);
  EXPECT_EQ(stats.eager_calls, 1u);
  EXPECT_EQ(stats.captures, 0u);
  EXPECT_STREQ(gf_runner_disabled_reason(runner_), "");
  backend_.outer_capture_active = 0;
  ClearLog();
  CallExpectingCorrect(inputs);
  EXPECT_EQ(Log().at(1), "probe_begin");
  EXPECT_EQ(Stats().captures, 1u);
}

// ---- outputs and inputs ------------------------------------------------------------------

TEST_F(Runner, StaticOutputsReturnTheSameBuffersEveryCall) {
  Create();
  Inputs first = MakeInputs(2, {3}, 1.0f);
  Result one = Call(first.views, kStaticOutputs);
  ASSERT_EQ(one.status, GF_OK);
  EXPECT_EQ(one.values[0], Expected(first.views));
  Inputs second = MakeInputs(2, {3}, 20.0f);
  ClearLog();
  Result two = Call(second.views, kStaticOutputs);
  ASSERT_EQ(two.status, GF_OK);
  EXPECT_EQ(two.values[0], Expected(second.views));
  EXPECT_EQ(one.data[0], two.data[0]);
  EXPECT_EQ(Log(), (Events{"copy_batch(2)", "launch"})) << "no output copy";
  // The buffer from the first call now holds the second call's values.
  EXPECT_EQ(ReadFloats(one.pool->tensors[0]), Expected(second.views));
  EXPECT_EQ(host_.empty_calls, 0u);
}

TEST_F(Runner, StaticOutputsOutliveTheGraphThatWroteThem) {
  Create();
  Inputs first = MakeInputs(1, {3}, 1.0f);
  Result one = Call(first.views, kStaticOutputs);
  ASSERT_EQ(one.status, GF_OK);
  gf_runner_reset(runner_);
  EXPECT_EQ(ReadFloats(one.pool->tensors[0]), Expected(first.views));
}

TEST_F(Runner, DefaultOutputsAreFreshClonesThatStayValid) {
  Create();
  Inputs first = MakeInputs(2, {3}, 1.0f);
  Result one = Call(first.views);
  Inputs second = MakeInputs(2, {3}, 20.0f);
  Result two = Call(second.views);
  ASSERT_EQ(one.status, GF_OK);
  ASSERT_EQ(two.status, GF_OK);
  EXPECT_NE(one.data[0], two.data[0]);
  EXPECT_EQ(ReadFloats(one.pool->tensors[0]), Expected(first.views))
      << "an earlier result must not change when the graph replays";
  EXPECT_EQ(ReadFloats(two.pool->tensors[0]), Expected(second.views));
  Result three = Call(first.views, kStaticOutputs);
  EXPECT_NE(three.data[0], one.data[0]);
  EXPECT_NE(three.data[0], two.data[0]);
}

TEST_F(Runner, NonContiguousInputIsAnInvalidArgument) {
  Create();
  Inputs inputs = MakeInputs(2, {2, 3}, 1.0f);
  std::vector<gf_tensor> views = {inputs.views[0], inputs.views[1]};
  views[1].sizes[0] = 3;
  views[1].sizes[1] = 2;
  views[1].strides[0] = 1;
  views[1].strides[1] = 3; // a transpose
  Result result = Call(views);
  EXPECT_EQ(result.status, GF_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(result.message, "input tensor 1")) << result.message;
  EXPECT_TRUE(Contains(result.message, "non-contiguous")) << result.message;
  EXPECT_TRUE(result.values.empty());
  EXPECT_TRUE(Log().empty());
  EXPECT_EQ(Stats().enabled, 1) << "a bad input is the caller's error, not the runner's";
  EXPECT_EQ(Stats().eager_calls, 0u);
}

TEST_F(Runner, InputOnAnotherDeviceIsAnInvalidArgument) {
  Create();
  Inputs inputs = MakeInputs(2, {3}, 1.0f);
  std::vector<gf_tensor> elsewhere = {inputs.views[0], inputs.views[1]};
  elsewhere[1].device_index = 1; // the runner captures on index 0
  Result result = Call(elsewhere);
  EXPECT_EQ(result.status, GF_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(result.message, "input tensor 1")) << result.message;
  EXPECT_TRUE(Contains(result.message, "runner's device")) << result.message;
  EXPECT_EQ(result.input_number, 2u) << "the layer above names input 1 in its own words";
  elsewhere[1] = inputs.views[1];
  elsewhere[0].device_type = GF_FAKE_DEVICE_TYPE + 1;
  result = Call(elsewhere);
  EXPECT_EQ(result.status, GF_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(result.message, "input tensor 0")) << result.message;
  EXPECT_TRUE(Log().empty());
  EXPECT_EQ(Stats().enabled, 1) << "a bad input is the caller's error, not the runner's";
  CallExpectingCorrect(inputs); // and the runner still captures and replays
  EXPECT_EQ(Stats().captures, 1u);
}

TEST_F(Runner, TooManyDimensionsIsAnInvalidArgument) {
  Create();
  Inputs inputs = MakeInputs(1, {1}, 1.0f);
  gf_tensor deep = inputs.views[0];
  deep.ndim = GF_MAX_DIMS + 1;
  Result result = Call({deep});
  EXPECT_EQ(result.status, GF_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(result.message, "dimensions")) << result.message;
  EXPECT_EQ(Stats().enabled, 1);
}

// ---- lifetime ----------------------------------------------------------------------------

TEST_F(Runner, ZeroMaxEntriesFailsCreateAndDestroysTheHost) {
  config_.max_entries = 0;
  EXPECT_EQ(Create(&backend_.table), GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(runner_, nullptr);
  EXPECT_TRUE(Contains(err_.message, "max_entries")) << err_.message;
  EXPECT_EQ(host_.destroyed, 1);
}

TEST_F(Runner, IncompleteHostFailsCreate) {
  gf_host table = gf_fake_host_table(&host_);
  table.retain = nullptr;
  EXPECT_EQ(gf_runner_create(&config_, &table, &backend_.table, &runner_, &err_),
            GF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(runner_, nullptr);
  EXPECT_EQ(host_.destroyed, 1);
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

} // namespace
