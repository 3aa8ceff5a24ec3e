#include "engine/engine.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/device_memory.h"
#include "core/log.h"
#include "engine/prompt_logprobs.h"
#include "engine/request_text.h"
#include "engine/stop_strings.h"
#include "model/forward_batch.h"
#include "ops/ops.h"

namespace tachyon {
namespace {

// MemAvailable from /proc/meminfo, in bytes (0 if unknown).
size_t host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream in(line.substr(13));
      size_t kib = 0;
      in >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

}  // namespace

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kContext: return "context";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kTransfer: return "transfer";
  }
  return "?";
}

struct Engine::Request {
  Request(RequestId id, std::vector<int32_t> prompt, int block_size, GenerationParams p, Sampler s)
      : seq(id, std::move(prompt), block_size), params(std::move(p)), sampler(std::move(s)) {}

  Sequence seq;
  GenerationParams params;
  Sampler sampler;
  std::optional<RequestText> text;  // unset when not detokenizing
  RequestTiming timing;
  uint64_t rng_draws = 0;  // values sample() drew from the sampler's stream (one per non-greedy token)
  // The last verify step's row (of its K + 1, or a tree's nodes + 1) that sampled the token
  // emitted last: 0 when no draft token was accepted, else 1 + the last accepted node.
  int verified_row = 0;
  // min_tokens: the tokens that may not be drawn while fewer are out (EOS unless ignored, and the
  // stop ids); empty when min_tokens is 0.
  std::vector<int32_t> min_tokens_banned;
  // params.grammar's state after the output so far (unset without a grammar).
  std::optional<GrammarMatcher> grammar;
  // params.prompt_logprobs: the entries so far (prompt positions 1, 2, ...), until the first
  // output with a token carries them.
  std::vector<PromptLogprob> prompt_logprobs;
  bool prompt_logprobs_sent = false;
  // More prompt positions' logits are needed (the prefill must keep every position's).
  bool needs_prompt_logits() const {
    return params.prompt_logprobs && !prompt_logprobs_sent &&
           static_cast<int>(prompt_logprobs.size()) < seq.num_prompt_tokens() - 1;
  }
};

Result<std::unique_ptr<Engine>> Engine::create(const LlamaModel& model, const Tokenizer* tokenizer,
                                               std::vector<int32_t> eos_token_ids, const EngineOptions& options) {
  const ModelConfig& c = model.config();
  if (options.kv.block_size <= 0 || options.kv.block_size > 1024) {
    return make_error(ErrorCode::kInvalidArgument, "block size {} must be in [1, 1024]", options.kv.block_size);
  }
  if (options.scheduler.max_batched_tokens <= 0 || options.scheduler.max_seqs <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "max_batched_tokens ({}) and max_seqs ({}) must be positive",
                      options.scheduler.max_batched_tokens, options.scheduler.max_seqs);
  }
  if (options.max_model_len < 0 || options.max_model_len > c.max_position_embeddings) {
    return make_error(ErrorCode::kInvalidArgument, "max_model_len {} must be in [1, {}] (the model's context)",
                      options.max_model_len, c.max_position_embeddings);
  }
  const Device device = model.device();
  const DType kv_dtype = options.kv.dtype.value_or(device.is_cpu() ? DType::kF32 : DType::kBF16);
  if (!ops::is_kv_cache_dtype(kv_dtype)) {
    return make_error(ErrorCode::kUnsupported, "kv cache dtype {} (f32, f16, bf16, i8 or f8e4m3)",
                      dtype_name(kv_dtype));
  }
  int max_model_len = options.max_model_len > 0 ? options.max_model_len : c.max_position_embeddings;
  const KvTierOptions& tiers = options.kv.tiers;
  if (tiers.window < 0 || (tiers.history != KvHistory::kSame && tiers.window == 0)) {
    return make_error(ErrorCode::kInvalidArgument, "kv window {} with history '{}': a window of at least 1 position",
                      tiers.window, kv_history_name(tiers.history));
  }
  if (tiers.attention_window() > 0 && options.spec.tree_nodes > 0) {
    return make_error(ErrorCode::kUnsupported,
                      "speculative decoding: token trees (--spec-tree) need full attention; --kv-history drop keeps a "
                      "window of {}",
                      tiers.window);
  }
  if (options.sparse_budget < 0 || options.sparse_sink_blocks < 0) {
    return make_error(ErrorCode::kInvalidArgument, "sparse budget {} and {} sink blocks must not be negative",
                      options.sparse_budget, options.sparse_sink_blocks);
  }
  if (options.sparse_budget > 0 && tiers.history_bits() == 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "block-sparse attention (sparse budget {}) picks among history blocks: it needs --kv-window and "
                      "--kv-history int8 or int4",
                      options.sparse_budget);
  }
  if (options.sparse_budget > 0 && c.sliding_window > 0) {
    return make_error(ErrorCode::kUnsupported,
                      "block-sparse attention (sparse budget {}): the model attends within a sliding window of {} "
                      "already",
                      options.sparse_budget, c.sliding_window);
  }
  // What one sequence holds at once in full-precision blocks: every position, or with a window
  // about the window's (dropped history frees the rest; int8 / int4 history keeps it, smaller, in
  // the history pool).
  const bool drop = tiers.attention_window() > 0;
  const int history_bits = tiers.history_bits();
  const int bs = options.kv.block_size;
  const int64_t window_tokens = static_cast<int64_t>(tiers.window) + bs;
  const int64_t resident_per_seq =
      drop || history_bits != 0 ? std::min<int64_t>(max_model_len, window_tokens) : max_model_len;
  const int64_t history_per_seq = history_bits != 0 ? std::max<int64_t>(0, max_model_len - tiers.window) : 0;

  KvCacheConfig kv;
  kv.num_layers = c.num_layers;
  kv.num_kv_heads = c.num_kv_heads;
  kv.head_dim = c.head_dim;
  kv.block_size = bs;
  kv.dtype = kv_dtype;
  kv.device = device;
  kv.tiers = tiers;
  kv.key_bounds = options.sparse_budget > 0;
  const int64_t blocks_per_seq = (resident_per_seq + bs - 1) / bs;
  const int64_t history_blocks_per_seq = (history_per_seq + bs - 1) / bs;
  // A draft model's cache has as many blocks as the target's: a memory budget pays for both.
  KvCacheConfig budgeted = kv;
  size_t draft_history_bytes = 0;  // the drafts' history blocks (as many as the target's), per block
  // (each draft model its own: a request drafts with one of them, but each may serve any request).
  if (options.spec.method == SpecMethod::kDraftModel && !options.spec.drafts.empty()) {
    size_t bytes_per_token = kv.bytes_per_token();
    for (const NamedDraft& named : options.spec.drafts) {
      if (named.model == nullptr) continue;  // validate() reports it
      const ModelConfig& d = named.model->config();
      KvCacheConfig draft = kv;
      draft.num_layers = d.num_layers;
      draft.num_kv_heads = d.num_kv_heads;
      draft.head_dim = d.head_dim;
      bytes_per_token += draft.bytes_per_token();
      draft_history_bytes += draft.bytes_per_history_block();
    }
    budgeted.num_layers = 1;
    budgeted.num_kv_heads = 1;
    budgeted.head_dim = static_cast<int>(bytes_per_token / (2 * dtype_size(kv.dtype)));
  }
  // Dropped or compressed history: the windows, and room for one step's prompt chunks on top.
  const int64_t chunk_blocks =
      drop || history_bits != 0 ? (options.scheduler.max_batched_tokens + bs - 1) / bs : 0;
  if (options.kv.num_blocks > 0) {
    kv.num_blocks = options.kv.num_blocks;
    kv.num_history_blocks =
        history_bits == 0 ? 0 : options.kv.num_history_blocks > 0 ? options.kv.num_history_blocks : kv.num_blocks;
  } else {
    size_t budget = options.kv.bytes;
    if (budget == 0) {
      const double fraction = options.kv.fraction > 0.0 ? options.kv.fraction : device.is_cpu() ? 0.25 : 0.9;
      if (!(fraction > 0.0 && fraction <= 0.95)) {
        return make_error(ErrorCode::kInvalidArgument, "kv cache fraction {} must be in (0, 0.95]", fraction);
      }
      size_t available = host_memory_available();
      if (!device.is_cpu()) {
        size_t total = 0;
        TACHYON_RETURN_IF_ERROR(memory_info(device, available, total));
      }
      budget = static_cast<size_t>(static_cast<double>(available) * fraction);
    }
    const int64_t max_seqs = options.scheduler.max_seqs;
    if (history_bits == 0) {
      // Without a budget given, no more than max_seqs sequences of max_model_len need.
      const int64_t wanted = blocks_per_seq * max_seqs + chunk_blocks;
      const int64_t fits = budgeted.blocks_for_budget(budget);
      kv.num_blocks = static_cast<int>(options.kv.bytes > 0 ? fits : std::min<int64_t>(wanted, fits));
    } else {
      // Split the budget as sequences of max_model_len use it: each a window of full-precision
      // blocks and the rest in history blocks, plus one step's prompt chunks at full precision.
      const size_t block_bytes = budgeted.bytes_per_block();
      const size_t history_bytes = kv.bytes_per_history_block() + draft_history_bytes;
      const size_t per_seq = static_cast<size_t>(blocks_per_seq) * block_bytes +
                             static_cast<size_t>(history_blocks_per_seq) * history_bytes;
      const size_t fixed = static_cast<size_t>(chunk_blocks) * block_bytes;
      const int64_t seqs = std::clamp<int64_t>(
          budget > fixed && per_seq > 0 ? static_cast<int64_t>((budget - fixed) / per_seq) : 0, 1, max_seqs);
      kv.num_blocks = static_cast<int>(std::min<int64_t>(seqs * blocks_per_seq + chunk_blocks, INT32_MAX));
      kv.num_history_blocks = static_cast<int>(std::min<int64_t>(std::max<int64_t>(1, seqs * history_blocks_per_seq), INT32_MAX));
      if (fixed + static_cast<size_t>(seqs) * per_seq > budget) {  // not even one sequence of max_model_len
        kv.num_blocks = std::max(1, static_cast<int>(std::min<size_t>(budget / 2 / std::max<size_t>(block_bytes, 1), INT32_MAX)));
        kv.num_history_blocks = std::max(
            1, static_cast<int>(std::min<size_t>(budget / 2 / std::max<size_t>(history_bytes, 1), INT32_MAX)));
      }
    }
  }
  if (kv.num_blocks < 1) {
    return make_error(ErrorCode::kOutOfMemory, "kv cache: the budget holds no block of {} bytes", kv.bytes_per_block());
  }
  const int64_t capacity = static_cast<int64_t>(kv.num_blocks) * bs;
  if ((drop || history_bits != 0) && capacity <= resident_per_seq) {
    return make_error(ErrorCode::kOutOfMemory,
                      "kv cache: {} blocks hold {} tokens; a sequence with a kv window of {} needs more than {}",
                      kv.num_blocks, capacity, tiers.window, resident_per_seq);
  }
  // Every position of a sequence somewhere: the full-precision blocks, or also the history pool.
  const int64_t holds = capacity + static_cast<int64_t>(kv.num_history_blocks) * bs;
  if (!drop && holds < max_model_len) {
    if (options.max_model_len > 0) {
      return make_error(ErrorCode::kOutOfMemory,
                        "kv cache: {} blocks ({} history blocks) hold {} tokens, less than max_model_len = {}; give "
                        "the cache more memory or lower max_model_len",
                        kv.num_blocks, kv.num_history_blocks, holds, max_model_len);
    }
    TACHYON_LOG_WARN("kv cache holds {} tokens: max_model_len lowered from {} to {}", holds, max_model_len, holds);
    max_model_len = static_cast<int>(holds);
  }
  if (!options.scheduler.chunked_prefill && options.scheduler.max_batched_tokens < max_model_len) {
    return make_error(ErrorCode::kInvalidArgument,
                      "without chunked prefill, max_batched_tokens ({}) must be at least max_model_len ({})",
                      options.scheduler.max_batched_tokens, max_model_len);
  }
  TACHYON_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(kv));
  TACHYON_LOG_INFO("kv cache: {} blocks of {} tokens, {} on {} ({:.1f} MiB); max_model_len {}{}{}", kv.num_blocks,
                   options.kv.block_size, dtype_name(kv.dtype), device.to_string(), static_cast<double>(cache.nbytes()) / (1 << 20),
                   max_model_len,
                   tiers.active() ? fmt::format("; kv window {}, history {}{}", tiers.window,
                                                kv_history_name(tiers.history),
                                                kv.num_history_blocks > 0
                                                    ? fmt::format(" ({} history blocks)", kv.num_history_blocks)
                                                    : std::string())
                                  : std::string(),
                   options.sparse_budget > 0
                       ? fmt::format("; block-sparse decode attention, budget {} tokens and {} sink block(s)",
                                     options.sparse_budget, options.sparse_sink_blocks)
                       : std::string());
  std::unique_ptr<Engine> engine(
      new Engine(model, tokenizer, std::move(eos_token_ids), options, max_model_len, std::move(cache)));
  SpecCacheGeometry spec_cache{engine->cache_.config().num_blocks, engine->cache_.config().block_size,
                               engine->cache_.config().dtype,
                               max_model_len,
                               options.batch_invariant ? ops::LinearMode::kBatchInvariant : ops::LinearMode::kFastest,
                               engine->cache_.config().tiers, engine->cache_.config().num_history_blocks};
  TACHYON_ASSIGN_OR_RETURN(engine->spec_, SpecDecoder::create(options.spec, model, spec_cache));
  return engine;
}

Engine::Engine(const LlamaModel& model, const Tokenizer* tokenizer, std::vector<int32_t> eos,
               const EngineOptions& options, int max_model_len, KvCache cache)
    : model_(model),
      tokenizer_(tokenizer),
      eos_token_ids_(std::move(eos)),
      options_(options),
      max_model_len_(max_model_len),
      cache_(std::move(cache)),
      blocks_(BlockManagerOptions{cache_.config().num_blocks, cache_.config().block_size, options.kv.prefix_caching,
                                  cache_.config().tiers, cache_.config().num_history_blocks}),
      scheduler_(options.scheduler, blocks_),
      sampler_(model.device(), model.config().vocab_size) {}

Engine::~Engine() = default;

void Engine::run_compressions() {
  if (blocks_.has_compressions()) cache_.compress_blocks(blocks_.take_compressions());
}

Result<RequestId> Engine::add_request(std::string_view prompt, GenerationParams params) {
  if (tokenizer_ == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, "the model has no tokenizer: give the prompt as token ids");
  }
  EncodeOptions eo;
  eo.add_bos = params.add_bos;
  eo.parse_special = params.parse_special;
  return add_request(tokenizer_->encode(prompt, eo), std::move(params));
}

Status Engine::validate_token_ids(std::span<const int32_t> ids, const char* what) const {
  const int vocab = model_.config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return make_error(ErrorCode::kInvalidArgument, "{} token {} at index {} is outside the vocabulary [0, {})", what,
                        ids[i], i, vocab);
    }
  }
  return Status::Ok();
}

Status Engine::validate_params(const GenerationParams& params) const {
  const int vocab = model_.config().vocab_size;
  if (params.max_tokens < 1) {
    return make_error(ErrorCode::kInvalidArgument, "max_tokens = {} must be at least 1", params.max_tokens);
  }
  if (params.stop_token_ids.size() > kMaxStopTokenIds) {
    return make_error(ErrorCode::kInvalidArgument, "{} stop token ids; at most {}", params.stop_token_ids.size(),
                      kMaxStopTokenIds);
  }
  for (int32_t id : params.stop_token_ids) {
    if (id < 0 || id >= vocab) {
      return make_error(ErrorCode::kInvalidArgument, "stop token id {} is outside the vocabulary [0, {})", id, vocab);
    }
  }
  if (params.min_tokens < 0 || params.min_tokens > params.max_tokens) {
    return make_error(ErrorCode::kInvalidArgument, "min_tokens = {} must be in [0, max_tokens = {}]",
                      params.min_tokens, params.max_tokens);
  }
  if (params.prompt_logprobs &&
      (*params.prompt_logprobs < 0 || *params.prompt_logprobs > SamplingParams::kMaxLogprobs)) {
    return make_error(ErrorCode::kInvalidArgument, "prompt_logprobs = {} must be in [0, {}]", *params.prompt_logprobs,
                      SamplingParams::kMaxLogprobs);
  }
  if (params.prompt_logprobs && params.prefill_only) {
    return make_error(ErrorCode::kInvalidArgument,
                      "prompt_logprobs: a prefill-only request hands its prompt over and keeps no logits");
  }
  TACHYON_RETURN_IF_ERROR(validate_stop_strings(params.stop));
  if (!params.stop.empty() && !(params.detokenize && tokenizer_ != nullptr)) {
    return make_error(ErrorCode::kInvalidArgument, "stop strings need detokenized output (a tokenizer)");
  }
  if (params.sparse_budget && *params.sparse_budget < 0) {
    return make_error(ErrorCode::kInvalidArgument, "sparse_budget = {} must not be negative", *params.sparse_budget);
  }
  if (params.sparse_budget.value_or(0) > 0 && !cache_.config().key_bounds) {
    return make_error(ErrorCode::kInvalidArgument,
                      "sparse_budget = {}: block-sparse attention is off on this engine (start it with a sparse "
                      "budget, --sparse-budget)",
                      *params.sparse_budget);
  }
  if (params.grammar && tokenizer_ == nullptr && !options_.grammar_vocabulary) {
    return make_error(ErrorCode::kInvalidArgument,
                      "a grammar (structured output) needs the model's tokenizer to know what each token spells");
  }
  if (!params.draft.empty() && (spec_ == nullptr || !spec_->has_draft(params.draft))) {
    const std::string names = spec_ ? spec_->draft_names() : std::string();
    return make_error(ErrorCode::kInvalidArgument, "draft \"{}\" is not loaded{}", params.draft,
                      names.empty() ? std::string(" (no named draft model is loaded)")
                                    : fmt::format(" (named drafts: {})", names));
  }
  return Status::Ok();
}

Result<std::unique_ptr<Engine::Request>> Engine::make_request(std::vector<int32_t> prompt_ids,
                                                              GenerationParams params) {
  TACHYON_RETURN_IF_ERROR(validate_params(params));
  TACHYON_ASSIGN_OR_RETURN(Sampler sampler, Sampler::create(params.sampling, model_.config().vocab_size));
  sampler.set_prompt(prompt_ids);
  const RequestId id = next_id_++;
  auto req =
      std::make_unique<Request>(id, std::move(prompt_ids), cache_.config().block_size, std::move(params), std::move(sampler));
  if (req->params.detokenize && tokenizer_ != nullptr) req->text.emplace(*tokenizer_, req->params, req->seq.tokens());
  if (req->params.min_tokens > 0) {
    std::vector<int32_t>& banned = req->min_tokens_banned;
    if (!req->params.ignore_eos) banned = eos_token_ids_;
    banned.insert(banned.end(), req->params.stop_token_ids.begin(), req->params.stop_token_ids.end());
    std::sort(banned.begin(), banned.end());
    banned.erase(std::unique(banned.begin(), banned.end()), banned.end());
  }
  // A cached position has no logits: a request that wants the prompt's computes all of it (its
  // blocks still join the cache for others). Once they are out, a recomputation may use the cache.
  if (req->needs_prompt_logits()) req->seq.set_prefix_lookup(false);
  if (req->params.grammar) {
    TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const TokenTrie> trie, token_trie());
    TACHYON_ASSIGN_OR_RETURN(GrammarMatcher matcher, GrammarMatcher::create(req->params.grammar, std::move(trie)));
    req->grammar.emplace(std::move(matcher));
  }
  req->timing.arrival = now();
  return req;
}

Result<std::shared_ptr<const TokenTrie>> Engine::token_trie() {
  if (token_trie_) return token_trie_;
  if (options_.grammar_vocabulary) {
    if (options_.grammar_vocabulary->vocab_size() != model_.config().vocab_size) {
      return make_error(ErrorCode::kInvalidArgument, "the grammar vocabulary has {} tokens, the model {}",
                        options_.grammar_vocabulary->vocab_size(), model_.config().vocab_size);
    }
    return token_trie_ = options_.grammar_vocabulary;
  }
  TACHYON_ASSIGN_OR_RETURN(token_trie_, grammar_vocabulary(*tokenizer_, model_.config().vocab_size, eos_token_ids_));
  return token_trie_;
}

Result<std::shared_ptr<const TokenTrie>> grammar_vocabulary(const Tokenizer& tokenizer, int vocab,
                                                            std::span<const int32_t> eos_ids) {
  std::vector<std::string> bytes(static_cast<size_t>(vocab));
  std::vector<int32_t> excluded;
  for (int32_t id = 0; id < std::min(vocab, tokenizer.vocab_size()); ++id) {
    if (tokenizer.is_special(id)) {
      excluded.push_back(id);
      continue;
    }
    bytes[static_cast<size_t>(id)] = tokenizer.token_to_piece(id);
  }
  std::vector<int32_t> eos;
  for (const int32_t id : eos_ids) {
    if (id >= 0 && id < vocab) eos.push_back(id);
  }
  return TokenTrie::build(std::move(bytes), eos, excluded);
}

Result<RequestId> Engine::add_request(std::vector<int32_t> prompt_ids, GenerationParams params,
                                      std::optional<double> arrival) {
  if (prompt_ids.empty()) return make_error(ErrorCode::kInvalidArgument, "the prompt is empty (no tokens)");
  TACHYON_RETURN_IF_ERROR(validate_token_ids(prompt_ids, "prompt"));
  if (static_cast<int64_t>(prompt_ids.size()) >= max_model_len_) {
    return make_error(ErrorCode::kOutOfRange,
                      "the prompt has {} tokens; the context holds {} (prompt and generated tokens together)",
                      prompt_ids.size(), max_model_len_);
  }
  TACHYON_ASSIGN_OR_RETURN(std::unique_ptr<Request> req, make_request(std::move(prompt_ids), std::move(params)));
  if (arrival) req->timing.arrival = std::min(*arrival, req->timing.arrival);
  const RequestId id = req->seq.id();
  TACHYON_RETURN_IF_ERROR(scheduler_.add(&req->seq));
  requests_.emplace(id, std::move(req));
  return id;
}

bool Engine::abort(RequestId id) {
  if (auto held = transfers_.find(id); held != transfers_.end()) {
    scheduler_.finish(&held->second->seq);
    transfers_.erase(held);
    return true;
  }
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  Request& req = *it->second;
  RequestOutput out;
  out.id = id;
  finish(req, FinishReason::kAbort, out);
  aborted_.push_back(std::move(out));
  requests_.erase(it);
  return true;
}

void Engine::fill_counts(const Request& req, RequestOutput& out) const {
  out.num_prompt_tokens = req.seq.num_prompt_tokens();
  out.num_generated_tokens = req.seq.num_generated();
  out.num_cached_tokens = std::max(0, req.seq.num_cached_prompt_tokens());
  out.num_preemptions = req.seq.num_preemptions();
}

void Engine::finish(Request& req, FinishReason reason, RequestOutput& out) {
  scheduler_.finish(&req.seq);
  if (spec_) spec_->release(req.seq.id());
  if (req.text && !req.text->matched()) {
    out.text += req.text->finish(reason);
    if (req.text->matched()) {  // the held-back tail completed a stop string
      reason = FinishReason::kStop;
      out.stop = {StopCause::Kind::kString, -1, req.text->matched_string()};
    }
  }
  out.finished = true;
  out.finish_reason = reason;
  req.timing.finished = now();
  fill_counts(req, out);
  out.timing = req.timing;
  ++stats_.requests_finished;
}

bool Engine::process_sample(Request& req, Result<SampleResult> sampled, RequestOutput& out) {
  if (!sampled.ok()) {
    out.error = sampled.status();
    finish(req, FinishReason::kError, out);
    return true;
  }
  return emit_token(req, std::move(*sampled), out);
}

bool Engine::emit_token(Request& req, SampleResult sampled, RequestOutput& out) {
  const int32_t token = sampled.token;
  if (req.grammar) {
    // Every row was masked to the grammar: a refusal means the masks and the matcher disagree.
    if (Status advanced = req.grammar->accept(token); !advanced.ok()) {
      out.error = advanced.with_context(fmt::format("structured output: token {} after {} tokens", token,
                                                    req.seq.num_generated()));
      finish(req, FinishReason::kError, out);
      return true;
    }
  }
  req.sampler.accept(token);
  req.seq.append_token(token);
  ++stats_.generated_tokens;
  const double t = now();
  if (req.timing.first_token < 0) req.timing.first_token = t;
  req.timing.token_times.push_back(t);
  out.new_token_ids.push_back(token);
  TokenLogprob lp;
  lp.token = token;
  lp.logprob = sampled.logprob;
  lp.top = std::move(sampled.top_logprobs);
  out.logprobs.push_back(std::move(lp));

  const auto is_in = [token](const std::vector<int32_t>& ids) {
    return std::find(ids.begin(), ids.end(), token) != ids.end();
  };
  // Before min_tokens tokens were out, EOS and stop ids were masked from the draw; were one drawn
  // anyway (nothing does), it would not end the request.
  const bool may_stop = req.seq.num_generated() > req.params.min_tokens;
  if (may_stop && ((!req.params.ignore_eos && is_in(eos_token_ids_)) || is_in(req.params.stop_token_ids))) {
    out.stop = {StopCause::Kind::kToken, token, {}};
    if (req.text && req.params.include_stop_str_in_output) out.text += req.text->push(token);
    finish(req, FinishReason::kStop, out);
    return true;
  }
  if (req.text) {
    out.text += req.text->push(token);
    if (req.text->matched()) {
      out.stop = {StopCause::Kind::kString, -1, req.text->matched_string()};
      finish(req, FinishReason::kStop, out);
      return true;
    }
  }
  if (req.seq.num_generated() >= req.params.max_tokens) {
    finish(req, FinishReason::kLength, out);
    return true;
  }
  if (req.seq.num_tokens() >= max_model_len_) {
    finish(req, FinishReason::kContext, out);
    return true;
  }
  if (req.params.prefill_only) {
    hold_for_transfer(req, out);
    return true;
  }
  fill_counts(req, out);
  return false;
}

void Engine::hold_for_transfer(Request& req, RequestOutput& out) {
  // The detokenizer and the stop-string matcher keep what they hold back: the adopting engine
  // rebuilds the same state from the tokens and goes on from there, so nothing is flushed here.
  scheduler_.hold_for_transfer(&req.seq);
  if (spec_) spec_->release(req.seq.id());
  out.finished = true;
  out.finish_reason = FinishReason::kTransfer;
  req.timing.finished = now();
  fill_counts(req, out);
  out.timing = req.timing;
  ++stats_.requests_finished;
}

void Engine::fail_step(const SchedulerStep& plan, const Status& error, std::vector<RequestOutput>& outputs) {
  TACHYON_LOG_ERROR("engine step failed, its {} sequences end with an error: {}", plan.chunks.size(), error.to_string());
  ++stats_.num_failed_steps;
  for (const ScheduledChunk& c : plan.chunks) {
    const RequestId id = c.seq->id();
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    RequestOutput out;
    out.id = id;
    out.error = error;
    finish(*it->second, FinishReason::kError, out);
    outputs.push_back(std::move(out));
    requests_.erase(it);
  }
}

std::vector<int> Engine::read_only_rows(const SchedulerStep& plan) const {
  std::vector<int> read_only(plan.chunks.size(), 0);
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    const Request& req = *requests_.at(c.seq->id());
    // Only prompt chunks: a request that needs prompt logits has generated nothing yet.
    if (c.num_draft == 0 && req.needs_prompt_logits()) read_only[i] = c.num_tokens - (c.sample ? 1 : 0);
  }
  return read_only;
}

std::vector<SampleRow> Engine::sample_rows(const SchedulerStep& plan, std::span<const int> read_only) {
  std::vector<SampleRow> rows;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    if (!c.sample && read_only[i] == 0) continue;
    Request& req = *requests_.at(c.seq->id());
    SampleRow row;
    row.sampler = &req.sampler;
    row.num_draft = c.num_draft;
    row.num_read_only = read_only[i];
    row.sample = c.sample;
    // The token drawn now is number num_generated + 1: no EOS or stop id while min_tokens are not out.
    if (c.sample && req.seq.num_generated() < req.params.min_tokens) row.banned = req.min_tokens_banned;
    if (req.grammar) {
      row.grammar = &*req.grammar;
      row.draft = c.seq->draft();
      row.draft_parents = c.seq->draft_parents();
    }
    rows.push_back(row);
  }
  return rows;
}

ForwardBatch Engine::batch_of(const SchedulerStep& plan, std::span<const int> read_only) {
  std::vector<SequenceChunk> chunks;
  chunks.reserve(plan.chunks.size());
  std::vector<std::vector<int32_t>> verify_tokens;  // speculative chunks: the last token, then the draft
  std::vector<std::vector<int32_t>> verify_parents;  // and for a draft tree, the chunk's parents
  verify_tokens.reserve(plan.chunks.size());
  verify_parents.reserve(plan.chunks.size());
  const double t_sched = now();
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    SequenceChunk sc;
    sc.block_table = &c.seq->block_table();
    sc.start_position = c.start;
    sc.tokens = c.seq->tokens().subspan(static_cast<size_t>(c.start), static_cast<size_t>(c.num_tokens - c.num_draft));
    sc.logits = read_only[i] > 0 ? LogitsWanted::kAll : c.sample ? LogitsWanted::kLast : LogitsWanted::kNone;
    if (c.num_draft > 0) {  // every row's logits verify the draft
      verify_tokens.emplace_back(sc.tokens.begin(), sc.tokens.end());
      verify_tokens.back().insert(verify_tokens.back().end(), c.seq->draft().begin(), c.seq->draft().end());
      sc.tokens = verify_tokens.back();
      sc.logits = LogitsWanted::kAll;
      if (!c.seq->draft_parents().empty()) {  // the last token is the root; draft i is chunk token 1 + i
        std::vector<int32_t>& parents = verify_parents.emplace_back(1, -1);
        for (const int32_t p : c.seq->draft_parents()) parents.push_back(p + 1);
        sc.tree_parents = parents;
      }
    }
    Request& req = *requests_.at(c.seq->id());
    sc.sparse_budget = req.params.sparse_budget.value_or(options_.sparse_budget);
    chunks.push_back(sc);
    if (req.timing.first_scheduled < 0) req.timing.first_scheduled = t_sched;
  }
  ForwardBatch batch = build_forward_batch(chunks);
  batch.attention.sparse_sink_blocks = options_.sparse_sink_blocks;
  return batch;
}

void Engine::record_prompt_logprobs(Request& req, const ScheduledChunk& c, int first, int n) {
  // Row j holds the logits of position c.start + j, which give prompt token c.start + j + 1's entry
  // (entry c.start + j of prompt_logprobs); a recomputed chunk (after a preemption) skips those
  // already made.
  const std::span<const int32_t> tokens = req.seq.tokens();
  const int have = static_cast<int>(req.prompt_logprobs.size());
  const int begin = std::max(0, have - c.start);
  const int end = std::min(n, req.seq.num_prompt_tokens() - 1 - c.start);
  if (begin >= end) return;
  TACHYON_CHECK(c.start + begin == have, "request {}: prompt logprobs up to {}, a chunk from {}", req.seq.id(), have,
                c.start);
  const int vocab = model_.config().vocab_size;
  const int top_n = *req.params.prompt_logprobs;
  req.prompt_logprobs.resize(static_cast<size_t>(c.start + end));
#pragma omp parallel for schedule(static) if (end - begin > 1)
  for (int j = begin; j < end; ++j) {
    const size_t position = static_cast<size_t>(c.start + j);
    req.prompt_logprobs[position] = prompt_logprob(sampler_.host_logits(first + j), vocab, tokens[position + 1], top_n);
  }
  if (!req.needs_prompt_logits()) req.seq.set_prefix_lookup(true);
}

void Engine::emit_outputs(const SchedulerStep& plan, std::span<const int> read_only, BatchSampler::Place place,
                          const Tensor* features, std::vector<RequestOutput>& outputs) {
  int row = 0;
  size_t entry = 0;  // of the step's SampleRows
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    if (!c.sample && read_only[i] == 0) continue;
    const RequestId id = c.seq->id();
    Request& req = *requests_.at(id);
    if (read_only[i] > 0) {  // always on the host (BatchSampler::place_for)
      record_prompt_logprobs(req, c, row, read_only[i]);
      row += read_only[i];
    }
    if (!c.sample) {
      ++entry;
      continue;
    }
    RequestOutput out;
    out.id = id;
    bool done = false;
    const int n = 1 + c.num_draft;
    if (const Status& masked = sampler_.row_status(entry); !masked.ok()) {  // its grammar allows no token
      out.error = masked.with_context("structured output");
      finish(req, FinishReason::kError, out);
      done = true;
    } else if (c.num_draft > 0) {
      done = place == BatchSampler::Place::kHost
                 ? verify_draft(req, sampler_.host_logits(row), out)
                 : verify_draft_ids(req, sampler_.device_ids(row, n), sampler_.device_logprobs(row, n), out);
    } else {
      // One draw from the request's stream per non-greedy token, on either path.
      if (!req.params.sampling.greedy()) ++req.rng_draws;
      if (place == BatchSampler::Place::kHost) {
        done = process_sample(req, sampler_.host_sample(entry), out);
      } else {
        SampleResult r;
        r.token = sampler_.device_ids(row, 1)[0];
        r.logprob = sampler_.device_logprobs(row, 1)[0];
        done = emit_token(req, std::move(r), out);
      }
    }
    if (req.params.prompt_logprobs && !req.prompt_logprobs_sent && !out.new_token_ids.empty()) {
      out.prompt_logprobs = std::move(req.prompt_logprobs);
      req.prompt_logprobs.clear();
      req.prompt_logprobs_sent = true;
    }
    if (!done && features != nullptr && features->defined() && !out.new_token_ids.empty()) {
      // The row that sampled the sequence's last token: after the last accepted draft node.
      const int64_t r = row + (c.num_draft > 0 ? req.verified_row : 0);
      const int64_t d = features->size(1);
      spec_->observe_features(id, std::span<const float>(features->data<float>() + r * d, static_cast<size_t>(d)));
    }
    row += n;
    ++entry;
    outputs.push_back(std::move(out));
    if (done) {
      auto it = requests_.find(id);
      if (it->second->seq.state() == SequenceState::kTransferring) transfers_.emplace(id, std::move(it->second));
      requests_.erase(it);
    }
  }
}

Result<std::vector<RequestOutput>> Engine::step() {
  std::vector<RequestOutput> outputs;
  outputs.swap(aborted_);
  if (scheduler_.idle()) return outputs;
  Timer step_timer;
  const int running_before = scheduler_.num_running();
  if (spec_) propose_drafts();
  Timer phase;
  const SchedulerStep plan = scheduler_.schedule();
  ++stats_.num_steps;
  if (plan.empty()) {
    stats_.schedule_seconds += phase.seconds();
    return outputs;
  }
  run_compressions();  // before the copies: a copy may write a block that just went to history
  cache_.copy_blocks(plan.copies);
  const std::vector<int> read_only = read_only_rows(plan);
  const ForwardBatch batch = batch_of(plan, read_only);
  stats_.prompt_tokens_computed += plan.num_prefill_tokens;
  stats_.kv_blocks_used_peak = std::max(stats_.kv_blocks_used_peak, blocks_.num_used());
  stats_.schedule_seconds += phase.seconds();

  phase.reset();
  ForwardOptions fo;
  fo.linear_mode = options_.batch_invariant ? ops::LinearMode::kBatchInvariant : ops::LinearMode::kFastest;
  fo.cuda_graphs = options_.cuda_graphs;
  const bool with_features = spec_ && spec_->wants_features();
  if (with_features) fo.hidden = &features_;
  // The rows to sample, in logits order: per sampled chunk one, or 1 + K for a draft of K, after
  // any read-only rows (prompt logprobs).
  const std::vector<SampleRow> rows = sample_rows(plan, read_only);
  BatchSampler::Place place = BatchSampler::Place::kHost;
  const Status ran = [&]() -> Status {
    TACHYON_ASSIGN_OR_RETURN(place, sampler_.begin(rows));
    if (place == BatchSampler::Place::kHost) {
      TACHYON_RETURN_IF_ERROR(model_.forward(batch, cache_, sampler_.logits(), fo));
    } else {
      TACHYON_RETURN_IF_ERROR(model_.forward_on_device(batch, cache_, sampler_.logits(), fo));
    }
    return sampler_.finish(rows);  // on the device, waits for the step
  }();
  stats_.forward_seconds += phase.seconds();
  if (!ran.ok()) {
    fail_step(plan, ran, outputs);
    return outputs;
  }

  phase.reset();
  scheduler_.complete(plan);
  run_compressions();
  const Tensor* features = with_features ? &features_ : nullptr;
  if (with_features && features_.defined() && !features_.device().is_cpu()) {
    // The proposer keeps each sequence's row on the host: [rows, hidden] f32, a small copy.
    auto host = copy_to(features_, Device::cpu(), "hidden rows");
    if (host.ok()) {
      host_features_ = std::move(host).value();
      features = &host_features_;
    } else {
      TACHYON_LOG_WARN("hidden rows for the proposer not copied: {}", host.status().to_string());
      features = nullptr;
    }
  }
  emit_outputs(plan, read_only, place, features, outputs);
  stats_.sample_seconds += phase.seconds();
  if (spec_ && plan.num_prefill_tokens == 0) {  // a decode step: what speculation's gate compares
    int64_t tokens = 0;
    for (const RequestOutput& o : outputs) tokens += static_cast<int64_t>(o.new_token_ids.size());
    spec_->record_step(running_before, plan.num_draft_tokens > 0, tokens, step_timer.seconds());
  }
  return outputs;
}

namespace {

// EngineStats' MoE fields from the model's counters [num_layers, num_experts + 2] (host).
void expert_stats(const ModelConfig& c, const Tensor& counts, EngineStats& s) {
  const int ne = c.num_experts;
  s.expert_tokens.assign(static_cast<size_t>(ne), 0);
  s.moe_distinct_experts = s.moe_layer_calls = 0;
  double imbalance = 0.0;
  int sparse = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    const int64_t* row = counts.data<int64_t>() + static_cast<int64_t>(l) * (ne + 2);
    int64_t total = 0, most = 0;
    for (int e = 0; e < ne; ++e) {
      s.expert_tokens[static_cast<size_t>(e)] += row[e];
      total += row[e];
      most = std::max(most, row[e]);
    }
    s.moe_distinct_experts += row[ne];
    s.moe_layer_calls += row[ne + 1];
    if (total > 0) imbalance += static_cast<double>(most) * ne / static_cast<double>(total);
    ++sparse;
  }
  s.moe_load_imbalance = sparse > 0 ? imbalance / sparse : 0.0;
}

}  // namespace

EngineStats Engine::stats(bool fresh_experts) const {
  EngineStats s = stats_;
  if (model_.config().is_moe()) {
    if (fresh_experts || expert_snapshot_at_ < 0.0 || now() - expert_snapshot_at_ >= 1.0) {
      // A failed read (the device's error, which the next step reports) keeps the last numbers.
      if (auto counts = model_.expert_token_counts(); counts.ok() && counts->defined()) {
        expert_stats(model_.config(), *counts, expert_snapshot_);
        expert_snapshot_at_ = now();
      }
    }
    s.expert_tokens = expert_snapshot_.expert_tokens;
    s.moe_distinct_experts = expert_snapshot_.moe_distinct_experts;
    s.moe_layer_calls = expert_snapshot_.moe_layer_calls;
    s.moe_load_imbalance = expert_snapshot_.moe_load_imbalance;
  }
  s.num_running = scheduler_.num_running();
  s.num_waiting = scheduler_.num_waiting();
  s.num_transferring = static_cast<int>(transfers_.size());
  s.kv_blocks_total = blocks_.num_blocks();
  s.kv_blocks_used = blocks_.num_used();
  s.kv_blocks_cached = blocks_.num_cached();
  s.kv_blocks_free = blocks_.num_free();
  s.kv_history_blocks_total = blocks_.num_history_blocks();
  s.kv_history_blocks_used = blocks_.num_history_used();
  s.kv_cache_bytes = cache_.nbytes();
  s.prefix = blocks_.prefix_stats();
  s.num_preemptions = scheduler_.num_preemptions();
  if (spec_) s.spec = spec_->stats();
  s.grammar_mask_seconds = sampler_.mask_seconds();
  s.grammar_mask_steps = sampler_.mask_steps();
  s.grammar_masked_rows = sampler_.masked_rows();
  return s;
}

Status Engine::check_no_leaks() const {
  std::vector<const BlockTable*> tables;
  for (const auto& [id, req] : requests_) tables.push_back(&req->seq.block_table());
  for (const auto& [id, req] : transfers_) tables.push_back(&req->seq.block_table());
  TACHYON_RETURN_IF_ERROR(blocks_.check(tables));
  if (requests_.empty() && transfers_.empty() && blocks_.num_used() != 0) {
    return make_error(ErrorCode::kInternal, "{} kv blocks still used with no request left", blocks_.num_used());
  }
  if (requests_.empty() && transfers_.empty() && blocks_.num_history_used() != 0) {
    return make_error(ErrorCode::kInternal, "{} kv history blocks still used with no request left",
                      blocks_.num_history_used());
  }
  if (spec_) TACHYON_RETURN_IF_ERROR(spec_->check_no_leaks());
  return Status::Ok();
}

const Sequence* Engine::find_sequence(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second->seq;
}

// ---- Disaggregation hook (engine/kv_hook.h; disagg/kv_export.h moves the bytes) ----

Status Engine::release_transfer(RequestId id, const HeldSequenceRead& read) {
  auto it = transfers_.find(id);
  if (it == transfers_.end()) {
    return make_error(ErrorCode::kNotFound,
                      "request {} holds no KV for transfer (unknown, not prefill-only, still running, or exported)", id);
  }
  std::unique_ptr<Request> req = std::move(it->second);
  transfers_.erase(it);
  const Sequence& seq = req->seq;
  TransferredSequence held;
  held.tokens = seq.tokens();
  held.num_prompt_tokens = seq.num_prompt_tokens();
  held.num_computed = seq.num_computed();
  held.sampler_seed = req->sampler.seed();
  held.rng_draws = req->rng_draws;
  // Full precision from the first resident position: before it, blocks were dropped (drop) or
  // re-quantized (int8 / int4: the table's leading entries, which travel as history rows).
  const BlockTable& table = seq.block_table();
  TACHYON_CHECK(table.num_history() == 0 || table.first_known_position() == 0,
                "request {}: {} released and {} history blocks", id, table.first_known_position(), table.num_history());
  held.first_position = std::min(table.first_resident_position(), held.num_computed);
  held.history_blocks = table.num_history();
  TACHYON_CHECK(held.num_computed == seq.num_tokens() - 1 && seq.block_table().num_tokens() >= held.num_computed,
                "request {} held with {} of {} tokens computed, table of {}", id, held.num_computed, seq.num_tokens(),
                seq.block_table().num_tokens());
  const Status st = read(held, SequenceBlocks{&cache_, table.blocks(), held.first_position, held.num_computed,
                                              held.history_blocks});
  scheduler_.finish(&req->seq);  // the blocks go back whatever happened
  return st;
}

Result<RequestId> Engine::adopt_sequence(const TransferredSequence& seq, const GenerationParams& params,
                                         const SequenceBlocksCopy& fill) {
  if (params.prefill_only || params.prompt_logprobs) {
    return make_error(ErrorCode::kInvalidArgument,
                      "kv import: an adopted request cannot be prefill-only or ask for prompt logprobs (its prompt "
                      "ran elsewhere)");
  }
  const int64_t num_tokens = static_cast<int64_t>(seq.tokens.size());
  if (seq.num_prompt_tokens < 1 || seq.num_prompt_tokens >= num_tokens || seq.num_computed != num_tokens - 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "kv import: {} tokens of which {} prompt and {} computed (needs a prompt, at least one generated "
                      "token, and every token but the last computed)",
                      num_tokens, seq.num_prompt_tokens, seq.num_computed);
  }
  TACHYON_RETURN_IF_ERROR(validate_token_ids(seq.tokens, "kv import:"));
  const int num_generated = static_cast<int>(num_tokens) - seq.num_prompt_tokens;
  if (num_tokens >= max_model_len_) {
    return make_error(ErrorCode::kOutOfRange, "kv import: {} tokens; the context holds {}", num_tokens, max_model_len_);
  }
  if (num_generated >= params.max_tokens) {
    return make_error(ErrorCode::kInvalidArgument, "kv import: {} tokens generated already, max_tokens = {}",
                      num_generated, params.max_tokens);
  }
  if (seq.first_position < 0 || seq.first_position > seq.num_computed) {
    return make_error(ErrorCode::kInvalidArgument, "kv import: K/V from position {} of {} computed", seq.first_position,
                      seq.num_computed);
  }
  if (seq.rng_draws > static_cast<uint64_t>(num_generated)) {
    return make_error(ErrorCode::kInvalidArgument, "kv import: {} random draws for {} generated tokens", seq.rng_draws,
                      num_generated);
  }
  if (params.sampling.seed && *params.sampling.seed != seq.sampler_seed) {
    return make_error(ErrorCode::kInvalidArgument, "kv import: the request's seed {} is not the exported stream's {}",
                      *params.sampling.seed, seq.sampler_seed);
  }

  // The same request state the exporting engine had after its last token: sampler history and
  // random stream, detokenizer and stop-string matcher (whose text that engine already reported).
  GenerationParams p = params;
  p.sampling.seed = seq.sampler_seed;
  const auto prompt_end = seq.tokens.begin() + seq.num_prompt_tokens;
  TACHYON_ASSIGN_OR_RETURN(std::unique_ptr<Request> req, make_request(std::vector<int32_t>(seq.tokens.begin(), prompt_end), std::move(p)));
  for (auto t = prompt_end; t != seq.tokens.end(); ++t) {
    if (req->grammar) {
      TACHYON_RETURN_IF_ERROR(req->grammar->accept(*t).with_context(
          fmt::format("kv import: generated token {} against the request's grammar", t - prompt_end)));
    }
    req->sampler.accept(*t);
    req->seq.append_token(*t);
    if (req->text) (void)req->text->push(*t);
    req->timing.token_times.push_back(req->timing.arrival);
  }
  for (uint64_t i = 0; i < seq.rng_draws; ++i) (void)req->sampler.rng().next_u64();
  req->rng_draws = seq.rng_draws;
  req->timing.first_scheduled = req->timing.arrival;
  req->timing.first_token = req->timing.arrival;

  const int history_end = seq.history_blocks * cache_.config().block_size;
  if (seq.history_blocks < 0 || history_end > seq.num_computed ||
      (seq.history_blocks > 0 &&
       (cache_.config().tiers.history_bits() == 0 || seq.first_position != history_end))) {
    return make_error(ErrorCode::kInvalidArgument,
                      "kv import: {} history blocks of {} positions (full precision from {}) for a cache with {} "
                      "history",
                      seq.history_blocks, cache_.config().block_size, seq.first_position,
                      kv_history_name(cache_.config().tiers.history));
  }
  TACHYON_ASSIGN_OR_RETURN(const int cached,
                           scheduler_.reserve_adopted(&req->seq, seq.num_computed, seq.history_blocks));
  // Positions [0, cached) came from the prefix cache, lie before the window (dropped history) or
  // arrive as history blocks; the rest are written by `fill`.
  if (cached < seq.first_position) {
    scheduler_.finish(&req->seq);
    return make_error(ErrorCode::kInvalidArgument,
                      "kv import: the K/V start at position {}; this engine needs them from position {} on (its KV "
                      "window {}, history {})",
                      seq.first_position, cached, cache_.config().tiers.window,
                      kv_history_name(cache_.config().tiers.history));
  }
  const Status st =
      fill(SequenceBlocks{&cache_, req->seq.block_table().blocks(), cached, seq.num_computed, seq.history_blocks});
  if (!st.ok()) {
    scheduler_.finish(&req->seq);
    return st.with_context("kv import");
  }
  scheduler_.admit_adopted(&req->seq);
  run_compressions();
  const RequestId id = req->seq.id();
  requests_.emplace(id, std::move(req));
  return id;
}

// ---- Speculative decoding hooks (the work is in speculative/spec_decoder.h) ----

void Engine::propose_drafts() {
  std::vector<SpecCandidate> candidates;
  for (auto& [id, req] : requests_) {
    Sequence& seq = req->seq;
    if (seq.state() != SequenceState::kDecoding) continue;
    // Up to K + 1 tokens come out of a step: K stops one short of max_tokens and of the context.
    // No draft while min_tokens masks EOS and stop ids: a draft's rows are drawn without the mask.
    const int left = std::min(req->params.max_tokens - seq.num_generated(), max_model_len_ - seq.num_tokens());
    const int room = seq.num_generated() < req->params.min_tokens ? 0 : left - 1;
    candidates.push_back({&seq, &req->sampler, room, req->params.draft, req->grammar ? &*req->grammar : nullptr});
  }
  // In request order, so that a step's draft batch does not depend on the hash map's order.
  std::sort(candidates.begin(), candidates.end(),
            [](const SpecCandidate& a, const SpecCandidate& b) { return a.seq->id() < b.seq->id(); });
  if (Status proposed = spec_->propose(candidates, scheduler_.num_running()); !proposed.ok()) {
    // The draft side failed (its forward): this step runs without drafts, and the proposer
    // starts over for these sequences. The target's output does not depend on drafts.
    TACHYON_LOG_WARN("speculative proposal failed, the step runs without drafts: {}", proposed.to_string());
    ++stats_.num_failed_proposals;
    for (const SpecCandidate& c : candidates) {
      c.seq->set_draft({});
      spec_->release(c.seq->id());
    }
  }
}

bool Engine::verify_draft(Request& req, const float* logits, RequestOutput& out) {
  return emit_verified(req, spec_->verify(req.seq, logits, model_.config().vocab_size, req.sampler), out);
}

bool Engine::verify_draft_ids(Request& req, std::span<const int32_t> ids, std::span<const float> logprobs,
                              RequestOutput& out) {
  return emit_verified(req, spec_->verify_greedy(req.seq, ids, logprobs), out);
}

bool Engine::emit_verified(Request& req, Result<Verification> verified, RequestOutput& out) {
  out.id = req.seq.id();
  if (!verified.ok()) {
    out.error = verified.status();
    finish(req, FinishReason::kError, out);
    return true;
  }
  // Stop conditions apply to every token in order; what follows a stop is dropped.
  int emitted = 0;
  bool done = false;
  for (SampleResult& r : verified->tokens) {
    ++emitted;
    if ((done = emit_token(req, std::move(r), out))) break;
  }
  // The sequence now holds `emitted` new tokens: all but the last are accepted drafts whose K/V
  // the step wrote; the rest of the draft's positions are rolled back. A tree's accepted branch
  // moves into place.
  const std::span<const int32_t> path = std::span<const int32_t>(verified->path).first(static_cast<size_t>(emitted - 1));
  req.verified_row = path.empty() ? 0 : 1 + path.back();
  cache_.copy_slots(scheduler_.accept_draft(&req.seq, path));
  run_compressions();
  return done;
}

}  // namespace tachyon
