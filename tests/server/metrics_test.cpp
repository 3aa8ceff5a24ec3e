// ServerMetrics: what the engine loop records (AsyncEngineMetrics) as the Prometheus text of GET
// /metrics, and the histograms' rendering.
#include <string>

#include <gtest/gtest.h>

#include "server/metrics.h"

namespace tachyon::server {
namespace {

TEST(ServerMetrics, HistogramsAreCumulative) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(0.5);
  h.observe(5.0);
  std::string out;
  h.render("x", out);
  EXPECT_EQ(out,
            "x_bucket{le=\"0.1\"} 1\nx_bucket{le=\"1\"} 3\nx_bucket{le=\"+Inf\"} 4\nx_sum 6.05\nx_count 4\n");
}

bool has_line(const std::string& text, const std::string& line) { return text.find(line + "\n") != std::string::npos; }

TEST(ServerMetrics, RendersWhatTheEngineLoopRecords) {
  ServerMetrics metrics;
  AsyncEngineMetrics& loop = metrics;
  RequestOutput out;
  out.finished = true;
  out.finish_reason = FinishReason::kLength;
  loop.record_finished(out, false);
  loop.record_finished(out, false);
  out.finish_reason = FinishReason::kAbort;
  loop.record_finished(out, true);  // a deadline: counted as a timeout, not an abort
  loop.record_adoption(true);
  loop.record_adoption(false);
  EngineStats stats;
  stats.kv_blocks_used = 3;
  stats.generated_tokens = 192;
  stats.prefix.hit_tokens = 32;
  loop.set_engine_stats(stats);
  const std::string m = metrics.render();
  EXPECT_TRUE(has_line(m, "tachyon_requests_finished_total{finish_reason=\"length\"} 2")) << m;
  EXPECT_TRUE(has_line(m, "tachyon_requests_finished_total{finish_reason=\"abort\"} 0")) << m;
  EXPECT_TRUE(has_line(m, "tachyon_requests_finished_total{finish_reason=\"timeout\"} 1")) << m;
  EXPECT_TRUE(has_line(m, "tachyon_kv_adoptions_total{outcome=\"ok\"} 1")) << m;
  EXPECT_TRUE(has_line(m, "tachyon_kv_adoptions_total{outcome=\"error\"} 1")) << m;
  EXPECT_TRUE(has_line(m, "tachyon_kv_cache_blocks_used 3")) << m;
  EXPECT_TRUE(has_line(m, "tachyon_generation_tokens_total 192")) << m;
  EXPECT_TRUE(has_line(m, "tachyon_prefix_cache_hits_total 32")) << m;
  EXPECT_EQ(metrics.engine_stats().kv_blocks_used, 3);
}

// A mixture of experts' load: tokens per expert, the imbalance and the distinct experts per
// layer-step; a dense model's stats render none of them.
TEST(ServerMetrics, RendersTheExpertsLoad) {
  ServerMetrics metrics;
  AsyncEngineMetrics& loop = metrics;
  loop.set_engine_stats(EngineStats{});
  EXPECT_EQ(metrics.render().find("tachyon_moe_"), std::string::npos);
  EngineStats stats;
  stats.expert_tokens = {5, 0, 7};
  stats.moe_distinct_experts = 12;
  stats.moe_layer_calls = 8;
  stats.moe_load_imbalance = 1.75;
  loop.set_engine_stats(stats);
  const std::string m = metrics.render();
  EXPECT_TRUE(has_line(m, "tachyon_moe_expert_tokens_total{expert=\"0\"} 5")) << m;
  EXPECT_TRUE(has_line(m, "tachyon_moe_expert_tokens_total{expert=\"1\"} 0")) << m;
  EXPECT_TRUE(has_line(m, "tachyon_moe_expert_tokens_total{expert=\"2\"} 7")) << m;
  EXPECT_TRUE(has_line(m, "tachyon_moe_load_imbalance 1.75")) << m;
  EXPECT_TRUE(has_line(m, "tachyon_moe_distinct_experts_per_layer_step 1.5")) << m;
}

}  // namespace
}  // namespace tachyon::server
