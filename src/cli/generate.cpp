// `tachyon generate`: prints only the generated text on stdout (streamed as it is decoded);
// load time, prompt and decode speed go to stderr.
#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/mapped_file.h"
#include "engine/generator.h"
#include "tokenizer/detokenizer.h"

namespace tachyon::cli {

namespace {

struct GenerateArgs {
  CommonOptions common;
  std::string prompt;
  std::string prompt_file;
  std::string prompt_ids;  // "[1, 2, 3]" or "1,2,3"
  int prompt_len = 0;      // random prompt of this many tokens (models without a tokenizer)
  int max_new_tokens = 128;
  SamplingParams sampling;
  int64_t seed = -1;
  bool ignore_eos = false;
  bool no_bos = false;
  bool special = false;
  std::string dtype = "bf16";
  int prefill_chunk = 512;
};

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::string s = text;
  if (!s.empty() && s.front() != '[') s = "[" + s + "]";
  nlohmann::json j = nlohmann::json::parse(s, nullptr, false);
  if (j.is_discarded() || !j.is_array()) {
    return make_error(ErrorCode::kInvalidArgument, "--prompt-ids '{}' is not a list of integers", text);
  }
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    if (!v.is_number_integer()) return make_error(ErrorCode::kInvalidArgument, "--prompt-ids holds {}", v.dump());
    ids.push_back(v.get<int32_t>());
  }
  return ids;
}

int run_generate(GenerateArgs& a) {
  const auto dtype = parse_dtype(a.dtype);
  if (!dtype) return report(make_error(ErrorCode::kInvalidArgument, "--dtype '{}' is not a dtype", a.dtype));
  if (a.seed >= 0) a.sampling.seed = static_cast<uint64_t>(a.seed);
  auto loaded = load(a.common, *dtype);
  if (!loaded.ok()) return report(loaded.status());
  LoadedModel& m = *loaded;
  const ModelConfig& config = m.model->config();
  Status valid = a.sampling.validate(config.vocab_size);
  if (!valid.ok()) return report(valid);

  std::vector<int32_t> prompt;
  if (!a.prompt_file.empty()) {
    auto text = read_text_file(a.prompt_file);
    if (!text.ok()) return report(text.status());
    a.prompt = *text;
  }
  if (!a.prompt_ids.empty()) {
    auto ids = parse_ids(a.prompt_ids);
    if (!ids.ok()) return report(ids.status());
    prompt = *ids;
  } else if (a.prompt_len > 0) {
    std::mt19937 rng(1234);
    prompt.resize(static_cast<size_t>(a.prompt_len));
    for (auto& id : prompt) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(config.vocab_size));
  } else if (m.tokenizer) {
    EncodeOptions eo;
    if (a.no_bos) eo.add_bos = false;
    eo.parse_special = a.special;
    prompt = m.tokenizer->encode(a.prompt, eo);
  } else {
    return report(make_error(ErrorCode::kInvalidArgument,
                             "{} has no tokenizer: give the prompt as --prompt-ids or --prompt-len", m.path));
  }
  if (prompt.empty()) return report(make_error(ErrorCode::kInvalidArgument, "the prompt is empty"));

  auto sampler = Sampler::create(a.sampling, config.vocab_size);
  if (!sampler.ok()) return report(sampler.status());
  GenerateOptions go;
  go.max_new_tokens = a.max_new_tokens;
  go.stop_token_ids = m.eos_token_ids;
  go.ignore_eos = a.ignore_eos;
  go.prefill_chunk = a.prefill_chunk;

  std::unique_ptr<IncrementalDetokenizer> detok;
  if (m.tokenizer && a.prompt_ids.empty() && a.prompt_len == 0) {
    DetokenizerOptions dopt;
    dopt.skip_special = true;
    detok = std::make_unique<IncrementalDetokenizer>(*m.tokenizer, dopt);
    // Prime with the prompt so that the first generated piece keeps its leading space.
    for (int32_t id : prompt) detok->push(id);
  }
  bool first = true;
  auto on_token = [&](const SampleResult& r) {
    const bool is_stop = !a.ignore_eos && std::find(m.eos_token_ids.begin(), m.eos_token_ids.end(), r.token) !=
                                              m.eos_token_ids.end();
    if (detok) {
      if (!is_stop) {
        const std::string piece = detok->push(r.token);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
      }
    } else {
      std::fprintf(stdout, "%s%d", first ? "" : " ", r.token);
    }
    first = false;
    std::fflush(stdout);
    return true;
  };
  auto stats = generate(*m.model, prompt, *sampler, go, on_token);
  if (detok) {
    const std::string rest = detok->flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!stats.ok()) return report(stats.status());
  const GenerateStats& s = *stats;
  const double weight_gb = static_cast<double>(m.model->weights().decode_bytes_per_token()) / 1e9;
  std::fprintf(stderr,
               "load %.2f s | prompt %d tokens in %.3f s (%.1f tok/s) | generated %d tokens in %.3f s (%.2f tok/s, "
               "%.2f GB weights/token) | finish: %s | seed %llu\n",
               m.load_seconds, s.prompt_tokens, s.prefill_seconds,
               s.prefill_seconds > 0 ? s.prompt_tokens / s.prefill_seconds : 0.0, s.generated_tokens, s.decode_seconds,
               s.decode_seconds > 0 && s.generated_tokens > 1 ? (s.generated_tokens - 1) / s.decode_seconds : 0.0,
               weight_gb, finish_reason_name(s.finish_reason), static_cast<unsigned long long>(sampler->seed()));
  return 0;
}

}  // namespace

void add_generate(CLI::App& app, std::function<int()>& run) {
  auto args = std::make_shared<GenerateArgs>();
  args->sampling.temperature = 0.8f;
  args->sampling.top_k = 40;
  args->sampling.top_p = 0.95f;
  args->sampling.min_p = 0.05f;
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a prompt");
  add_common_options(*cmd, args->common);
  cmd->add_option("-p,--prompt", args->prompt, "prompt text");
  cmd->add_option("-f,--file", args->prompt_file, "read the prompt from a file");
  cmd->add_option("--prompt-ids", args->prompt_ids, "prompt as token ids, e.g. '[1, 15, 27]'");
  cmd->add_option("--prompt-len", args->prompt_len, "random prompt of N tokens (for speed runs)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("-n,--max-tokens", args->max_new_tokens, "tokens to generate (default 128)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--temp", args->sampling.temperature, "temperature; 0 = greedy (default 0.8)");
  cmd->add_option("--top-k", args->sampling.top_k, "top-k; 0 = off (default 40)");
  cmd->add_option("--top-p", args->sampling.top_p, "top-p (default 0.95)");
  cmd->add_option("--min-p", args->sampling.min_p, "min-p (default 0.05)");
  cmd->add_option("--repeat-penalty", args->sampling.repetition_penalty, "repetition penalty (default 1.0 = off)");
  cmd->add_option("--presence-penalty", args->sampling.presence_penalty, "presence penalty (default 0)");
  cmd->add_option("--frequency-penalty", args->sampling.frequency_penalty, "frequency penalty (default 0)");
  cmd->add_option("--seed", args->seed, "sampling seed (default: random; printed on stderr)");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "keep generating past end-of-sequence tokens");
  cmd->add_flag("--no-bos", args->no_bos, "do not add the BOS token");
  cmd->add_flag("--special", args->special, "parse special tokens written in the prompt");
  cmd->add_option("--dtype", args->dtype, "weight dtype of synthetic models: bf16, f16, f32 (default bf16)");
  cmd->add_option("--prefill-chunk", args->prefill_chunk, "prompt tokens per forward (default 512)")
      ->check(CLI::PositiveNumber);
  cmd->callback([args, &run]() { run = [args]() { return run_generate(*args); }; });
}

}  // namespace tachyon::cli
