// `tachyon info MODEL`: architecture, shapes, dtypes, tokenizer kind and the memory needed.
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "model/synthetic.h"

namespace tachyon::cli {

namespace {

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", bytes, units[u]);
}

void print_config(const ModelConfig& c) {
  std::printf("architecture:   %s\n", c.architecture.c_str());
  std::printf("parameters:     %.3f M\n", static_cast<double>(c.num_parameters()) / 1e6);
  if (c.is_moe()) {
    int sparse = 0;
    for (int l = 0; l < c.num_layers; ++l) sparse += c.is_moe_layer(l) ? 1 : 0;
    std::printf("experts:        %d per sparse layer (%d of %d layers), top %d%s, expert ffn %d%s\n", c.num_experts,
                sparse, c.num_layers, c.num_experts_per_tok, c.norm_topk_prob ? " renormalised" : "",
                c.moe_intermediate_size,
                c.shared_expert_intermediate_size > 0
                    ? fmt::format(", shared expert ffn {}", c.shared_expert_intermediate_size).c_str()
                    : "");
    std::printf("active:         %.3f M parameters per token\n", static_cast<double>(c.active_parameters()) / 1e6);
  }
  std::printf("vocab:          %d\n", c.vocab_size);
  std::printf("hidden:         %d, ffn %d, layers %d\n", c.hidden_size, c.intermediate_size, c.num_layers);
  std::printf("attention:      %d heads, %d kv heads, head_dim %d%s%s%s\n", c.num_heads, c.num_kv_heads, c.head_dim,
              c.attention_bias ? ", qkv bias" : "", c.qk_norm ? ", q/k norm" : "",
              c.sliding_window ? fmt::format(", sliding window {}", c.sliding_window).c_str() : "");
  std::printf("rope:           theta %g, %s%s\n", static_cast<double>(c.rope.theta),
              c.rope.style == RopeStyle::kNeox ? "neox (half split)" : "interleaved (adjacent pairs)",
              c.rope.scaling == RopeScaling::kNone     ? ""
              : c.rope.scaling == RopeScaling::kLinear ? ", linear scaling"
              : c.rope.scaling == RopeScaling::kLlama3 ? ", llama3 scaling"
                                                       : ", yarn scaling");
  std::printf("context:        %d tokens\n", c.max_position_embeddings);
  std::printf("embeddings:     %s\n", c.tie_word_embeddings ? "tied" : "separate LM head");
}

void print_kv(const ModelConfig& c) {
  const size_t kv_per_token_f32 = 2ull * static_cast<size_t>(c.num_layers) * static_cast<size_t>(c.kv_dim()) * 4;
  std::printf("kv cache:       %s per token (f32), %s for the full context\n",
              human_bytes(static_cast<double>(kv_per_token_f32)).c_str(),
              human_bytes(static_cast<double>(kv_per_token_f32) * c.max_position_embeddings).c_str());
}

// A synthetic preset from its shape alone: its weights (tens of GB for the large presets) are
// never made.
int run_synthetic_info(const std::string& model) {
  auto config = synthetic_config(model.substr(10));
  if (!config.ok()) return report(config.status());
  const ModelConfig& c = *config;
  std::printf("model:          %s (synthetic, random bf16 weights)\n", model.c_str());
  print_config(c);
  const double row = c.hidden_size, table = static_cast<double>(c.vocab_size) * c.hidden_size;
  // A token reads the LM head and one embedding row, not the table (unless it is the head).
  const double per_token = static_cast<double>(c.active_parameters()) - (c.tie_word_embeddings ? 0.0 : table) + row;
  std::printf("weights:        %s (%s read per decoded token)\n",
              human_bytes(2.0 * static_cast<double>(c.num_parameters())).c_str(), human_bytes(2.0 * per_token).c_str());
  print_kv(c);
  return 0;
}

int run_info(const CommonOptions& options) {
  if (options.model.rfind("synthetic:", 0) == 0) return run_synthetic_info(options.model);
  auto loaded = load(options);
  if (!loaded.ok()) return report(loaded.status());
  const LoadedModel& m = *loaded;
  const ModelConfig& c = m.model->config();
  const ModelWeights& w = m.model->weights();
  std::printf("model:          %s (%s)\n", m.path.c_str(), m.format.c_str());
  print_config(c);
  std::printf("weight dtypes:  %s\n", m.weight_dtypes.c_str());
  // Per type the file stores: packed (its kernels read the blocks) or expanded at load.
  for (size_t i = 0; i < m.tensor_types.size(); ++i) {
    std::printf("%s%s\n", i == 0 ? "tensor types:   " : "                ", m.tensor_types[i].c_str());
  }
  std::printf("weights:        %s (%s read per decoded token)\n", human_bytes(static_cast<double>(w.total_bytes())).c_str(),
              human_bytes(static_cast<double>(w.decode_bytes_per_token(c.num_experts_per_tok))).c_str());
  print_kv(c);
  if (m.tokenizer) {
    std::printf("tokenizer:      %s\n", m.tokenizer->describe().c_str());
  } else {
    std::printf("tokenizer:      none\n");
  }
  std::string eos;
  for (int32_t id : m.eos_token_ids) eos += fmt::format("{}{}", eos.empty() ? "" : ", ", id);
  std::printf("bos / eos:      %d / [%s]\n", m.bos_token_id, eos.c_str());
  return 0;
}

}  // namespace

void add_info(CLI::App& app, std::function<int()>& run) {
  auto options = std::make_shared<CommonOptions>();
  CLI::App* cmd = app.add_subcommand("info", "print a model's architecture, shapes, dtypes, tokenizer and memory");
  cmd->add_option("model", options->model, "the model (as for -m)");
  cmd->add_option("-m,--model", options->model, "the model");
  cmd->add_flag("-v,--verbose", options->verbose, "log details");
  cmd->callback([options, &run]() {
    run = [options]() {
      if (options->model.empty()) return report(make_error(ErrorCode::kInvalidArgument, "info: give a model"));
      return run_info(*options);
    };
  });
}

}  // namespace tachyon::cli
