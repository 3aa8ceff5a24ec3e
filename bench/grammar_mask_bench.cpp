// grammar_mask_bench: what GrammarMatcher::fill_mask costs per decode step on a 128k-token vocabulary.
//
//   grammar_mask_bench [--tokenizer DIR] [--synthetic] [--repeats 3] [--json FILE]
//
// Vocabulary: Llama 3's tiktoken file (DIR/tokenizer.model + tokenizer_config.json; default
// ../shared/tokenizers/llama3 beside the source tree), read through the project's Tokenizer; --synthetic or a
// missing file: 128,000 generated tokens of JSON-ish and English-ish pieces. Scenarios, each a document that
// the grammar accepts, tokenized with that vocabulary (the synthetic one: greedy longest match) and fed token
// by token, with fill_mask timed before every token (the mask must allow it): a JSON Schema over a
// pretty-printed order record; the same record under response_format json_object; and a schema whose one
// value is a long free-text string (nearly every token is allowed inside a string: the costliest walk).
// The first mask of a fresh matcher (empty caches) is reported apart ("cold"). Each scenario runs with the
// matcher's per-state mask cache (the default) and without it ("/walk": every mask a full trie walk).
// JSON goes to stdout (or --json FILE), a one-line summary per scenario to stderr.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/timer.h"
#include "sampling/grammar_matcher.h"
#include "sampling/json_schema.h"
#include "sampling/synthetic_vocabulary.h"
#include "sampling/token_trie.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace tachyon::bench {
namespace {

using ojson = nlohmann::ordered_json;

struct Vocabulary {
  std::string source;
  std::vector<std::string> token_bytes;
  std::vector<int32_t> eos_ids;
  std::vector<int32_t> special_ids;
  std::unique_ptr<Tokenizer> tokenizer;  // null for the synthetic vocabulary
};

Vocabulary load_llama3(const std::string& dir) {
  Vocabulary v;
  auto specials = read_hf_special_tokens(dir + "/tokenizer_config.json");
  if (!specials.ok()) return v;
  TiktokenOptions options;
  options.bos_token = "<|begin_of_text|>";
  options.eos_tokens = {"<|eot_id|>", "<|end_of_text|>"};
  auto tokenizer = Tokenizer::from_tiktoken(dir + "/tokenizer.model", std::string(kLlama3Pattern), *specials, options);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "grammar_mask_bench: %s; using the synthetic vocabulary\n",
                 tokenizer.status().to_string().c_str());
    return v;
  }
  v.tokenizer = std::move(tokenizer).value();
  v.source = "llama3 tiktoken (" + dir + ")";
  for (int32_t id = 0; id < v.tokenizer->vocab_size(); ++id) {
    v.token_bytes.push_back(v.tokenizer->token_to_piece(id));
    if (v.tokenizer->is_special(id)) v.special_ids.push_back(id);
  }
  v.eos_ids = v.tokenizer->eos_ids();
  return v;
}

// 128,000 tokens (sampling/synthetic_vocabulary.h), and a special token after them.
Vocabulary made_up_vocabulary() {
  Vocabulary v;
  v.source = "synthetic (128000 tokens)";
  SyntheticVocabulary made = synthetic_vocabulary(127999).value();
  v.token_bytes = std::move(made.token_bytes);
  v.eos_ids = {made.eos_id};
  v.special_ids = {static_cast<int32_t>(v.token_bytes.size())};
  v.token_bytes.push_back("<|start_header_id|>");
  return v;
}

// Token ids for `text`: the real tokenizer, else greedy longest match over the synthetic vocabulary.
std::vector<int32_t> tokenize(const Vocabulary& v, const std::string& text) {
  if (v.tokenizer) return v.tokenizer->encode(text, EncodeOptions(false));
  std::map<std::string, int32_t> index;
  for (size_t id = 0; id < v.token_bytes.size(); ++id) index.emplace(v.token_bytes[id], static_cast<int32_t>(id));
  std::vector<int32_t> ids;
  for (size_t pos = 0; pos < text.size();) {
    for (size_t len = std::min<size_t>(16, text.size() - pos); len > 0; --len) {
      auto it = index.find(text.substr(pos, len));
      if (it != index.end()) {
        ids.push_back(it->second);
        pos += len;
        break;
      }
    }
  }
  return ids;
}

const char* kOrderSchema = R"({
  "type": "object",
  "properties": {
    "order_id": {"type": "string", "format": "uuid"},
    "created": {"type": "string", "format": "date-time"},
    "status": {"enum": ["pending", "paid", "shipped", "cancelled"]},
    "customer": {"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 80},
      "email": {"type": "string", "format": "email"},
      "vip": {"type": "boolean"}}, "required": ["name", "email"]},
    "items": {"type": "array", "minItems": 1, "maxItems": 20, "items": {"$ref": "#/$defs/item"}},
    "total": {"type": "number", "minimum": 0},
    "notes": {"type": ["string", "null"]}
  },
  "required": ["order_id", "status", "customer", "items", "total"],
  "$defs": {"item": {"type": "object", "properties": {
    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
    "quantity": {"type": "integer", "minimum": 1, "maximum": 999},
    "price": {"type": "number", "minimum": 0}}, "required": ["sku", "quantity", "price"]}}
})";

const char* kOrderDocument = R"({
  "order_id": "3f2b8c1e-9a4d-4e7b-8c2a-1d5e6f7a8b9c",
  "created": "2024-05-17T14:03:22Z",
  "status": "shipped",
  "customer": {
    "name": "Ada Lovelace",
    "email": "ada@example.com",
    "vip": true
  },
  "items": [
    {
      "sku": "ABC-1234",
      "quantity": 2,
      "price": 19.99
    },
    {
      "sku": "XYZ-0042",
      "quantity": 1,
      "price": 249.5
    }
  ],
  "total": 289.48,
  "notes": "Leave the parcel with the neighbour if nobody answers; the bell is broken."
})";

const char* kTextSchema = R"({"type": "object", "properties": {"summary": {"type": "string"}},
                             "required": ["summary"]})";

std::string text_document() {
  std::string text =
      "The quick brown fox jumps over the lazy dog. Grammar-constrained decoding keeps the model inside the "
      "schema: inside a string almost every token is allowed, so the mask walk visits most of the trie. ";
  std::string body;
  for (int i = 0; i < 3; ++i) body += text;
  return "{\"summary\": \"" + body + "\"}";
}

struct Scenario {
  std::string name;
  std::shared_ptr<const Grammar> grammar;
  std::string document;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

ojson run_scenario(const Scenario& s, bool mask_cache, const Vocabulary& v,
                   const std::shared_ptr<const TokenTrie>& trie, int repeats, bool& ok) {
  const std::vector<int32_t> ids = tokenize(v, s.document);
  std::vector<uint32_t> mask(grammar_mask_words(trie->vocab_size()));
  std::vector<double> step_ms;
  std::vector<double> accept_ms;
  double cold_ms = 0.0;
  int64_t allowed_total = 0;
  int32_t cached_states = 0;
  int32_t stack_frames = 0;
  int64_t cache_flushes = 0;
  for (int r = 0; r < repeats; ++r) {
    GrammarMatcherOptions options;
    if (!mask_cache) options.max_cached_masks = 0;
    Result<GrammarMatcher> created = GrammarMatcher::create(s.grammar, trie, options);
    if (!created.ok()) {
      std::fprintf(stderr, "%s: %s\n", s.name.c_str(), created.status().to_string().c_str());
      ok = false;
      return {};
    }
    GrammarMatcher m = std::move(created).value();
    for (size_t i = 0; i <= ids.size(); ++i) {
      Timer t;
      const Status filled = m.fill_mask(mask);
      const double ms = t.millis();
      if (!filled.ok()) {
        std::fprintf(stderr, "%s: step %zu: %s\n", s.name.c_str(), i, filled.to_string().c_str());
        ok = false;
        return {};
      }
      if (i == 0 && r == 0)
        cold_ms = ms;
      else
        step_ms.push_back(ms);
      if (r == 0) {
        for (uint32_t word : mask) allowed_total += __builtin_popcount(word);
      }
      const int32_t next = i < ids.size() ? ids[i] : v.eos_ids.at(0);
      if (!grammar_mask_test(mask, next)) {
        std::fprintf(stderr, "%s: step %zu: the mask refuses token %d ('%s')\n", s.name.c_str(), i, next,
                     std::string(trie->token_bytes(next)).c_str());
        ok = false;
        return {};
      }
      Timer a;
      const Status accepted = m.accept(next);
      accept_ms.push_back(a.millis());
      if (!accepted.ok()) {
        std::fprintf(stderr, "%s: %s\n", s.name.c_str(), accepted.to_string().c_str());
        ok = false;
        return {};
      }
    }
    cached_states = m.num_cached_states();
    stack_frames = m.num_stack_frames();
    cache_flushes = m.num_cache_flushes();
  }
  double sum = 0.0;
  for (double x : step_ms) sum += x;
  const double mean = step_ms.empty() ? 0.0 : sum / static_cast<double>(step_ms.size());
  ojson out{{"scenario", s.name},
            {"mask_cache", mask_cache},
            {"document_tokens", ids.size()},
            {"steps_timed", step_ms.size()},
            {"fill_mask_ms", {{"cold_first", cold_ms}, {"mean", mean}, {"p50", percentile(step_ms, 0.5)},
                              {"p90", percentile(step_ms, 0.9)}, {"p99", percentile(step_ms, 0.99)},
                              {"max", percentile(step_ms, 1.0)}}},
            {"accept_ms_mean", accept_ms.empty() ? 0.0 : [&] {
               double a = 0.0;
               for (double x : accept_ms) a += x;
               return a / static_cast<double>(accept_ms.size());
             }()},
            {"allowed_tokens_mean", static_cast<double>(allowed_total) / static_cast<double>(ids.size() + 1)},
            {"cached_states", cached_states},
            {"stack_frames", stack_frames},
            {"cache_flushes", cache_flushes}};
  std::fprintf(stderr,
               "grammar_mask_bench %-17s %4zu tokens: fill_mask mean %.3f ms, p50 %.3f, p99 %.3f, max %.3f, "
               "cold %.3f ms; %.0f tokens allowed on average\n",
               (s.name + (mask_cache ? "" : "/walk")).c_str(), ids.size(), mean, percentile(step_ms, 0.5),
               percentile(step_ms, 0.99), percentile(step_ms, 1.0), cold_ms,
               static_cast<double>(allowed_total) / static_cast<double>(ids.size() + 1));
  return out;
}

int run(int argc, char** argv) {
  std::string tokenizer_dir = std::string(TACHYON_SOURCE_DIR) + "/../shared/tokenizers/llama3";
  if (const char* shared = std::getenv("TACHYON_SHARED_DIR"))
    tokenizer_dir = std::string(shared) + "/tokenizers/llama3";
  bool synthetic = false;
  int repeats = 3;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--synthetic") {
      synthetic = true;
    } else if (a == "--tokenizer" && i + 1 < argc) {
      tokenizer_dir = argv[++i];
    } else if (a == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: grammar_mask_bench [--tokenizer DIR] [--synthetic] [--repeats N] [--json FILE]\n");
      return 2;
    }
  }
  Vocabulary v;
  if (!synthetic && std::filesystem::exists(tokenizer_dir + "/tokenizer.model")) v = load_llama3(tokenizer_dir);
  if (v.token_bytes.empty()) v = made_up_vocabulary();

  Timer trie_timer;
  auto trie = TokenTrie::build(v.token_bytes, v.eos_ids, v.special_ids);
  const double trie_ms = trie_timer.millis();
  if (!trie.ok()) {
    std::fprintf(stderr, "grammar_mask_bench: %s\n", trie.status().to_string().c_str());
    return 1;
  }

  Timer compile_timer;
  Result<Grammar> order = json_schema_to_grammar(std::string_view(kOrderSchema));
  const double compile_ms = compile_timer.millis();
  Result<Grammar> object = json_object_grammar();
  Result<Grammar> text = json_schema_to_grammar(std::string_view(kTextSchema));
  for (const Result<Grammar>* g : {&order, &object, &text}) {
    if (!g->ok()) {
      std::fprintf(stderr, "grammar_mask_bench: %s\n", g->status().to_string().c_str());
      return 1;
    }
  }
  const std::vector<Scenario> scenarios = {
      {"json_schema", std::make_shared<const Grammar>(std::move(order).value()), kOrderDocument},
      {"json_object", std::make_shared<const Grammar>(std::move(object).value()), kOrderDocument},
      {"long_string", std::make_shared<const Grammar>(std::move(text).value()), text_document()},
  };
  ojson results = ojson::array();
  bool ok = true;
  for (const Scenario& s : scenarios) {
    // With the per-state mask cache (the default), and without it: every mask a full trie walk.
    for (bool mask_cache : {true, false}) {
      ojson r = run_scenario(s, mask_cache, v, *trie, repeats, ok);
      if (!ok) return 1;
      results.push_back(std::move(r));
    }
  }
  const ojson report{
      {"vocabulary", v.source},   {"vocab_size", (*trie)->vocab_size()}, {"trie_nodes", (*trie)->num_nodes()},
      {"trie_build_ms", trie_ms}, {"schema_compile_ms", compile_ms},     {"repeats", repeats},
      {"scenarios", results}};
  if (json_path.empty()) {
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    std::ofstream(json_path) << report.dump(2) << "\n";
  }
  std::fprintf(stderr,
               "grammar_mask_bench: %s, %d tokens, trie of %d nodes built in %.1f ms, schema compiled in %.2f ms\n",
               v.source.c_str(), (*trie)->vocab_size(), (*trie)->num_nodes(), trie_ms, compile_ms);
  return 0;
}

}  // namespace
}  // namespace tachyon::bench

int main(int argc, char** argv) { return tachyon::bench::run(argc, argv); }
