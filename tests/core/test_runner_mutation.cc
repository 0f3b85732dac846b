// Tests of inputs the forward writes in place (a KV cache advanced by index_copy_): eager
// semantics say the caller's tensor changes once per call. The capture finds such inputs through
// the host, and every replay writes the static buffer's new values back into the caller's tensor,
// inside the output copy node when the copies are folded, in the output batch otherwise. The
// forward runs are told their phase, so a capture-aware forward can take its capture branch while
// it is warmed up.
#include "gf_runner.h"
#include "gf_test_fakes.h"
#include "runner_fixture.h"

#include <gtest/gtest.h>

#include <vector>

namespace {

using namespace runner_test;

class RunnerMutation : public Runner {
protected:
  void SetUp() override {
    Runner::SetUp();
    host_.mutate_input = 1; // the forward adds 1 to input 1 after computing its output
  }

  // Calls with fresh inputs and checks eager semantics: the output is computed from the values
  // before the write, and the caller's input 1 moved by exactly 1.
  void CallAndExpectOneWrite(float seed, unsigned char *mutated = nullptr) {
    Inputs inputs = MakeInputs(2, {4}, seed);
    Values expected = Expected(inputs.views);
    Values before = ReadFloats(inputs.views[1]);
    gf_call_options options = kDefault;
    options.mutated_inputs = mutated;
    Result result = Call(inputs.views, options);
    ASSERT_EQ(result.status, GF_OK) << result.message;
    EXPECT_EQ(result.values[0], expected);
    Values after = ReadFloats(inputs.views[1]);
    for (size_t e = 0; e < before.size(); ++e) {
      EXPECT_EQ(after[e], before[e] + 1.0f) << "element " << e << " at seed " << seed;
    }
    EXPECT_EQ(ReadFloats(inputs.views[0]), MakeInputs(1, {4}, seed).buffers[0])
        << "an input the forward only reads is not written";
  }
};

TEST_F(RunnerMutation, EveryReplayWritesTheInputBackOnce) {
  Create();
  for (float seed : {1.0f, 7.0f, -2.0f}) {
    CallAndExpectOneWrite(seed);
  }
  EXPECT_EQ(Stats().captures, 1u);
  EXPECT_EQ(Stats().replays, 3u);
  ClearLog();
  CallAndExpectOneWrite(11.0f);
  EXPECT_EQ(Log(), (Events{"copy_batch(2)", "launch", "copy_batch(2)"}))
      << "the write-back rides in the output batch: still one batch on each side";
}

TEST_F(RunnerMutation, FoldedReplayWritesBackInsideTheOneLaunch) {
  gf_fake_backend_enable_folding(&backend_);
  Create();
  CallAndExpectOneWrite(1.0f);
  EXPECT_TRUE(Contains(Log().back(), "launch_folded(2,2)")) << Log().back();
  ClearLog();
  CallAndExpectOneWrite(5.0f);
  EXPECT_EQ(Log(), (Events{"launch_folded(2,2)"}));
}

TEST_F(RunnerMutation, ReportsTheWrittenInputsToACallerThatAsks) {
  Create();
  unsigned char mutated[2] = {9, 9};
  CallAndExpectOneWrite(1.0f, mutated); // capture and replay
  EXPECT_EQ(mutated[0], 0);
  EXPECT_EQ(mutated[1], 1);
  mutated[0] = mutated[1] = 9;
  CallAndExpectOneWrite(2.0f, mutated); // replay
  EXPECT_EQ(mutated[0], 0);
  EXPECT_EQ(mutated[1], 1);
}

TEST_F(RunnerMutation, AnEagerCallWritesOnceAndReportsIt) {
  config_.enabled = 0;
  Create();
  unsigned char mutated[2] = {9, 9};
  CallAndExpectOneWrite(3.0f, mutated);
  EXPECT_EQ(mutated[0], 0);
  EXPECT_EQ(mutated[1], 1);
  EXPECT_EQ(Stats().eager_calls, 1u);
}

TEST_F(RunnerMutation, ACallerPassingTheStaticBufferGetsItWrittenInPlace) {
  Create();
  Inputs first = MakeInputs(2, {4}, 1.0f);
  ASSERT_EQ(Call(first.views).status, GF_OK);
  gf_tensor static_cache = host_.clones[1];
  Values before = ReadFloats(static_cache);
  Inputs other = MakeInputs(1, {4}, 4.0f);
  std::vector<gf_tensor> mixed = {other.views[0], static_cache};
  ClearLog();
  Result result = Call(mixed);
  ASSERT_EQ(result.status, GF_OK) << result.message;
  Values after = ReadFloats(static_cache);
  for (size_t e = 0; e < before.size(); ++e) {
    EXPECT_EQ(after[e], before[e] + 1.0f);
  }
  EXPECT_EQ(Log(), (Events{"copy_batch(1)", "launch", "copy_batch(1)"}))
      << "neither the copy in nor the write-back copies the static buffer onto itself";
}

TEST_F(RunnerMutation, ForwardsAreToldTheirPhase) {
  Create();
  CallAndExpectOneWrite(1.0f);
  EXPECT_EQ(host_.phase_calls[GF_PHASE_PROBE], 1u);
  EXPECT_EQ(host_.phase_calls[GF_PHASE_WARMUP], 1u); // warmup_iters = 2: the probe and one more
  EXPECT_EQ(host_.phase_calls[GF_PHASE_CAPTURE], 1u);
  EXPECT_EQ(host_.phase_calls[GF_PHASE_EAGER], 0u);
  gf_runner_disable(runner_, GF_CAUSE_USER, "test");
  CallAndExpectOneWrite(2.0f);
  EXPECT_EQ(host_.phase_calls[GF_PHASE_EAGER], 1u);
}

TEST_F(RunnerMutation, AForwardThatWritesNothingGetsNoWriteBack) {
  host_.mutate_input = -1;
  Create();
  Inputs inputs = MakeInputs(2, {4}, 1.0f);
  CallExpectingCorrect(inputs);
  ClearLog();
  CallExpectingCorrect(inputs);
  EXPECT_EQ(Log(), (Events{"copy_batch(2)", "launch", "copy_batch(1)"}));
}

} // namespace
