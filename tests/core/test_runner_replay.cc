// Tests of replay with batched copies: a hit copies its inputs in one batch, launches, and copies
// its outputs in one batch, however many inputs there are; an input already in its static buffer is
// not copied (the same address with other strides is); every output of a multi-output forward is
// replayed; the output modes (static outputs are the same buffers every call, default outputs are
// fresh clones that stay valid); and a launch or output copy failing on a later replay.
#include "gf_runner.h"
#include "gf_test_fakes.h"
#include "runner_fixture.h"

#include <gtest/gtest.h>

#include <vector>

namespace {

using namespace runner_test;

// ---- replays -----------------------------------------------------------------------------

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

// ---- verify mode's comparison -------------------------------------------------------------

// What the recording compare_later hook was last given: whether its state was the runner's (the
// token runner_create handed out), and how many pairs.
struct Compared {
  int calls = 0;
  bool runners_state = false;
  size_t count = 0;
};
Compared compared;

gf_status RecordCompare(void *context, void *state, const gf_copy *pairs, size_t count,
                        uint8_t *verdict, uint32_t *scratch, gf_error *err) {
  (void)pairs;
  (void)scratch;
  (void)err;
  compared.calls++;
  compared.runners_state =
      state != nullptr && state == static_cast<gf_fake_backend *>(context)->state;
  compared.count = count;
  *verdict = 0;
  return GF_OK;
}

TEST_F(Runner, CompareLaterOfABackendWithoutTheHookQueuesNothing) {
  Create();
  float left = 1.0f, right = 1.0f;
  const gf_copy pair = {&left, &right, sizeof left};
  uint8_t verdict = 2;
  uint32_t scratch[2] = {0, 0};
  EXPECT_EQ(gf_runner_compare_later(runner_, &pair, 1, &verdict, scratch, &err_), GF_ERR_NOT_FOUND);
  EXPECT_EQ(verdict, 2);
}

TEST_F(Runner, CompareLaterReachesTheBackendWithTheRunnersState) {
  compared = Compared{};
  backend_.table.compare_later = RecordCompare;
  Create();
  CallExpectingCorrect(MakeInputs(1, {2}, 1.0f));
  float left[2] = {1.0f, 2.0f}, right[2] = {1.0f, 2.0f};
  const gf_copy pairs[2] = {{&left[0], &right[0], sizeof left[0]}, {&left[1], &right[1], 4}};
  uint8_t verdict = 2;
  uint32_t scratch[2] = {0, 0};
  ASSERT_EQ(gf_runner_compare_later(runner_, pairs, 2, &verdict, scratch, &err_), GF_OK);
  EXPECT_EQ(compared.calls, 1);
  EXPECT_TRUE(compared.runners_state);
  EXPECT_EQ(compared.count, 2u);
  EXPECT_EQ(verdict, 0);
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

// ---- outputs -----------------------------------------------------------------------------

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

// ---- failures on a later replay ----------------------------------------------------------

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
  EXPECT_EQ(gf_runner_disabled_cause(runner_), GF_CAUSE_REPLAY_FAILED);
  EXPECT_STREQ(gf_disable_cause_name(gf_runner_disabled_cause(runner_)), "replay_failed");
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

} // namespace
