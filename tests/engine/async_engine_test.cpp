// AsyncEngine without the network: many submitters, outputs on each request's stream, aborts that
// free KV blocks at the next step, the bounded waiting queue, deadlines and the drain.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "engine/async_engine.h"
#include "engine/recording_metrics.h"
#include "engine/stream_collector.h"
#include "model/model_loader.h"
#include "test_util.h"

namespace tachyon {
namespace {

class AsyncEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new LoadedModel(testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo"));
  }
  static void TearDownTestSuite() { delete model_; }

  std::unique_ptr<AsyncEngine> make(AsyncEngineOptions ao, int max_seqs = 64) {
    EngineOptions eo;
    eo.kv.num_blocks = 256;
    eo.scheduler.max_seqs = max_seqs;
    auto e = Engine::create(*model_->model, model_->tokenizer.get(), model_->eos_token_ids, eo);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return std::make_unique<AsyncEngine>(std::move(*e), ao, metrics_);
  }

  static std::shared_ptr<RequestStream> stream(int max_tokens, uint64_t seed = 1) {
    GenerationParams p;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    p.sampling.seed = seed;
    return std::make_shared<RequestStream>(model_->tokenizer->encode("Once upon a time"), p);
  }

  using Collector = testing::StreamCollector;

  static inline LoadedModel* model_ = nullptr;
  testing::RecordingMetrics metrics_;
};

// A server hands each step's ready streams over at once (to its I/O threads): every output still
// arrives, through notifications made on another thread, and one step's streams come together.
TEST_F(AsyncEngineTest, OneStepsReadyStreamsAreHandedOverTogether) {
  auto engine = make({});
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<std::shared_ptr<RequestStream>>> batches;  // not yet notified
  size_t largest = 0, handed = 0;
  bool stop = false;
  engine->set_notify_ready([&](std::vector<std::shared_ptr<RequestStream>>&& ready) {
    std::lock_guard lock(mu);
    largest = std::max(largest, ready.size());
    handed += ready.size();
    batches.push_back(std::move(ready));
    cv.notify_one();
  });
  std::thread notifier([&] {  // stands for an I/O thread
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stop || !batches.empty(); });
      if (batches.empty()) return;
      auto batch = std::move(batches.front());
      batches.erase(batches.begin());
      lock.unlock();
      for (const auto& s : batch) s->notify();
      lock.lock();
    }
  });
  constexpr int kStreams = 8, kTokens = 12;
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::unique_ptr<Collector>> collectors;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(stream(kTokens, static_cast<uint64_t>(i)));
    collectors.push_back(std::make_unique<Collector>());
    collectors.back()->attach(streams.back());
  }
  EXPECT_EQ(engine->submit(streams), SubmitError::kNone);
  // EXPECT, not ASSERT: the notifier thread must be stopped and joined on every path.
  for (auto& c : collectors) EXPECT_TRUE(c->wait_finished());
  {
    std::lock_guard lock(mu);
    stop = true;
  }
  cv.notify_one();
  notifier.join();
  for (auto& c : collectors) {
    EXPECT_EQ(c->tokens().size(), static_cast<size_t>(kTokens));
    EXPECT_EQ(c->outputs.back().finish_reason, FinishReason::kLength);
  }
  // Eight requests submitted together decode in the same steps.
  EXPECT_GE(largest, 2u);
  EXPECT_GE(handed, static_cast<size_t>(kStreams));
}

// A request's timings count from when the server read it (its stream was made), not from when
// the engine loop got to it: a wait before the loop admits it is part of its TTFT and queue time.
TEST_F(AsyncEngineTest, TimingsCountFromWhenTheRequestWasRead) {
  auto engine = make({});
  auto s = stream(4);
  Collector c;
  c.attach(s);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  ASSERT_EQ(engine->submit({s}), SubmitError::kNone);
  ASSERT_TRUE(c.wait_finished());
  const RequestTiming& t = c.outputs.back().timing;
  EXPECT_GE(t.first_scheduled - t.arrival, 0.05);
  EXPECT_GE(t.first_token - t.arrival, 0.05);
  EXPECT_GE(t.finished, t.first_token);
}

TEST_F(AsyncEngineTest, ManySubmittersEachGetTheirTokens) {
  auto engine = make({});
  constexpr int kThreads = 8, kPerThread = 4, kTokens = 6;
  std::vector<std::unique_ptr<Collector>> collectors(kThreads * kPerThread);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        auto s = stream(kTokens, static_cast<uint64_t>(t * 100 + i));
        auto& c = collectors[static_cast<size_t>(t * kPerThread + i)];
        c = std::make_unique<Collector>();
        c->attach(s);
        ASSERT_EQ(engine->submit({s}), SubmitError::kNone);
        ASSERT_TRUE(c->wait_finished());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& c : collectors) {
    int tokens = 0;
    for (const auto& o : c->outputs) tokens += static_cast<int>(o.new_token_ids.size());
    EXPECT_EQ(tokens, kTokens);
    EXPECT_EQ(c->outputs.back().finish_reason, FinishReason::kLength);
  }
  engine->begin_drain();
  ASSERT_TRUE(testing::wait_stopped(*engine)) << "the loop did not stop after the drain";
  EXPECT_EQ(engine->num_unfinished(), 0);
  EXPECT_EQ(metrics_.engine_stats().kv_blocks_used, 0);
  EXPECT_EQ(metrics_.finished(FinishReason::kLength), 32);
  EXPECT_EQ(metrics_.engine_stats().generated_tokens, 192);
}

TEST_F(AsyncEngineTest, AbortFreesBlocksAtTheNextStep) {
  auto engine = make({});
  auto s = stream(400);
  Collector c;
  c.attach(s);
  ASSERT_EQ(engine->submit({s}), SubmitError::kNone);
  ASSERT_TRUE(c.wait_tokens(2));
  engine->abort(s);
  ASSERT_TRUE(c.wait_finished());
  EXPECT_EQ(c.outputs.back().finish_reason, FinishReason::kAbort);
  EXPECT_FALSE(s->timed_out());
  engine->begin_drain();
  ASSERT_TRUE(testing::wait_stopped(*engine)) << "the loop did not stop after the drain";
  EXPECT_EQ(metrics_.engine_stats().kv_blocks_used, 0);
  EXPECT_EQ(metrics_.finished(FinishReason::kAbort), 1);
}

TEST_F(AsyncEngineTest, AbortBeforeAdmissionNeverRuns) {
  auto engine = make({});
  auto s = stream(4);
  engine->abort(s);  // cancelled first: the loop skips it
  ASSERT_EQ(engine->submit({s}), SubmitError::kNone);
  engine->begin_drain();
  ASSERT_TRUE(testing::wait_stopped(*engine)) << "the loop did not stop after the drain";
  EXPECT_EQ(engine->num_unfinished(), 0);
  EXPECT_TRUE(s->take().empty());
}

TEST_F(AsyncEngineTest, BoundedQueueRefusesAndDrainRefuses) {
  AsyncEngineOptions ao;
  ao.max_waiting = 2;
  auto engine = make(ao, /*max_seqs=*/1);
  auto running = stream(400);
  Collector c;
  c.attach(running);
  ASSERT_EQ(engine->submit({running}), SubmitError::kNone);
  ASSERT_TRUE(c.wait_tokens(1));  // admitted: it runs, nothing waits
  auto a = stream(400, 2), b = stream(400, 3), d = stream(4, 4);
  EXPECT_EQ(engine->submit({a, b, d}), SubmitError::kQueueFull);  // all or nothing
  EXPECT_EQ(engine->submit({a, b}), SubmitError::kNone);
  EXPECT_EQ(engine->submit({d}), SubmitError::kQueueFull);
  for (const auto& s : {running, a, b}) engine->abort(s);
  engine->begin_drain();
  EXPECT_EQ(engine->submit({d}), SubmitError::kDraining);
  ASSERT_TRUE(testing::wait_stopped(*engine)) << "the loop did not stop after the drain";
  EXPECT_EQ(engine->num_unfinished(), 0);
}

TEST_F(AsyncEngineTest, DeadlineAbortsAndMarksTheStream) {
  AsyncEngineOptions ao;
  ao.request_timeout = 0.001;  // far below 400 engine steps
  auto engine = make(ao);
  auto s = stream(400);
  Collector c;
  c.attach(s);
  ASSERT_EQ(engine->submit({s}), SubmitError::kNone);
  ASSERT_TRUE(c.wait_finished());
  EXPECT_EQ(c.outputs.back().finish_reason, FinishReason::kAbort);
  EXPECT_TRUE(s->timed_out());
  EXPECT_EQ(metrics_.timed_out(), 1);
}

// The choices of an n > 1 request: the others wait for choice 0's prefill and then take the
// prompt's full blocks from the prefix cache.
TEST_F(AsyncEngineTest, ChoicesOfOnePromptShareItsKv) {
  auto engine = make({});
  std::vector<int32_t> prompt = model_->tokenizer->encode(
      "Once upon a time, in a land far away, there lived a programmer who wrote servers in C++ all day long. "
      "Every morning she read the logs, and every evening she fixed what they said.");
  ASSERT_GE(prompt.size(), 33u);
  const int full_blocks = static_cast<int>((prompt.size() - 1) / 16);  // the last token is always recomputed
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::unique_ptr<Collector>> collectors;
  for (int j = 0; j < 3; ++j) {
    GenerationParams p;
    p.max_tokens = 4;
    p.ignore_eos = true;
    p.sampling.seed = 7 + static_cast<uint64_t>(j);
    streams.push_back(std::make_shared<RequestStream>(prompt, p));
    if (j > 0) streams.back()->set_leader(streams[0]);
    collectors.push_back(std::make_unique<Collector>());
    collectors.back()->attach(streams.back());
  }
  ASSERT_EQ(engine->submit(streams), SubmitError::kNone);
  for (auto& c : collectors) ASSERT_TRUE(c->wait_finished());
  engine->begin_drain();
  ASSERT_TRUE(testing::wait_stopped(*engine)) << "the loop did not stop after the drain";
  EXPECT_EQ(metrics_.engine_stats().prefix.hit_tokens, 2 * full_blocks * 16);
  EXPECT_EQ(metrics_.finished(FinishReason::kLength), 3);
}

}  // namespace
}  // namespace tachyon
