// Robustness: real chat templates mutated at random (bytes flipped, inserted, deleted, tag
// fragments spliced in, whole pieces duplicated or swapped) must parse and render to either a
// result or an error Status: never a crash, a hang or runaway memory. The seed is printed so that
// a failure can be replayed (TACHYON_FUZZ_SEED=...); TACHYON_FUZZ_ITERATIONS scales the run.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer_test_util.h"

namespace tachyon::testing {
namespace {

std::vector<std::string> real_templates() {
  std::vector<std::string> out;
  const std::string dir = source_dir() + "/tests/fixtures/chat_templates/templates";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".jinja") out.push_back(read_file_bytes(entry.path().string()));
  }
  std::sort(out.begin(), out.end());
  out.push_back(std::string(chatml_template_source()));
  return out;
}

// Pieces of Jinja syntax to splice in: they drive the mutants deeper into the parser than random
// bytes would.
const char* const kFragments[] = {
    "{{", "}}", "{%", "%}", "{#", "#}", "{%-", "-%}", "{{-", "-}}", "{%+", "+%}", "{% endif %}", "{% endfor %}",
    "{% else %}", "{% elif x %}", "{% for m in messages %}", "{% if loop.last %}", "{% set ns.x = 1 %}",
    "{% set x %}", "{% endset %}", "{% macro m(a, b=1) %}", "{% endmacro %}", "{{ m(1) }}", "{% raw %}", "{% endraw %}",
    "{% break %}", "{% continue %}", "{% call m() %}", "{% endcall %}", "{% filter upper %}", "{% endfilter %}",
    "|", "|tojson(indent=2)", "|trim", "|join(', ')", "|map(attribute='role')", "|selectattr('role', 'equalto', 'user')",
    " is defined", " is not none", " is string", " in ", " not in ", " and ", " or ", " not ", " if ", " else ",
    "[", "]", "(", ")", "{", "}", "[::-1]", "[1:]", "[-1]", ".content", ".role", "['content']", ".items()", ".split('x')",
    ",", ":", "~", "+", "-", "*", "**", "/", "//", "%", "==", "!=", "<", ">=", "'", "\"", "\\", "'\\u00e9'",
    "raise_exception('boom')", "namespace(a=1)", "range(10)", "range(100000)", "strftime_now('%Y')", "loop.index0",
    "messages", "tools", "none", "true", "1e308", "-9223372036854775807", "0x", "\n", "\r\n", " ", "\t", "\xC3\xA9",
    "\xF0\x9F\xA6\x99", "\xFF", "\xC3", "\0",
};

std::string mutate(const std::string& source, const std::vector<std::string>& corpus, std::mt19937& rng) {
  std::string s = source;
  // Mostly one small change, so that many mutants still parse and exercise the renderer.
  const int n = (rng() % 2 == 0) ? 1 : std::uniform_int_distribution<int>(2, 6)(rng);
  for (int i = 0; i < n; ++i) {
    const size_t size = s.size();
    auto pos = [&] { return std::uniform_int_distribution<size_t>(0, size)(rng); };
    switch (std::uniform_int_distribution<int>(0, 7)(rng)) {
      case 0:  // flip a byte
        if (size > 0) s[std::min(pos(), size - 1)] = static_cast<char>(rng());
        break;
      case 1:  // delete a span
        if (size > 0) {
          const size_t at = std::min(pos(), size - 1);
          s.erase(at, std::uniform_int_distribution<size_t>(1, 32)(rng));
        }
        break;
      case 2:
      case 3: {  // splice a syntax fragment
        const auto& fragment = kFragments[std::uniform_int_distribution<size_t>(0, std::size(kFragments) - 1)(rng)];
        s.insert(pos(), fragment, fragment[0] == '\0' ? 1 : std::strlen(fragment));
        break;
      }
      case 4:  // duplicate a span
        if (size > 0) {
          const size_t at = std::min(pos(), size - 1);
          const size_t len = std::uniform_int_distribution<size_t>(1, 200)(rng);
          s.insert(pos(), s.substr(at, len));
        }
        break;
      case 5: {  // splice a span from another template
        const std::string& other = corpus[std::uniform_int_distribution<size_t>(0, corpus.size() - 1)(rng)];
        if (!other.empty()) {
          const size_t at = std::uniform_int_distribution<size_t>(0, other.size() - 1)(rng);
          s.insert(pos(), other.substr(at, std::uniform_int_distribution<size_t>(1, 300)(rng)));
        }
        break;
      }
      case 6:  // truncate
        s.resize(pos());
        break;
      default:  // swap two bytes
        if (size > 1) std::swap(s[std::min(pos(), size - 1)], s[std::min(pos(), size - 1)]);
        break;
    }
  }
  return s;
}

nlohmann::ordered_json fuzz_messages() {
  return nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "Hello {{ x }} <|im_end|> é"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "abcdefghi", "type": "function",
      "function": {"name": "f", "arguments": {"a": [1, 2.5, null, true]}}}]},
    {"role": "tool", "tool_call_id": "abcdefghi", "content": "42"},
    {"role": "assistant", "content": "<think>hm</think>done"},
    {"role": "user", "content": ""}
  ])");
}

TEST(ChatTemplateFuzz, MutatedRealTemplatesNeverCrash) {
  const std::vector<std::string> corpus = real_templates();
  ASSERT_GE(corpus.size(), 10u);
  const char* seed_env = std::getenv("TACHYON_FUZZ_SEED");
  const uint32_t seed = seed_env != nullptr ? static_cast<uint32_t>(std::strtoul(seed_env, nullptr, 10)) : fresh_seed();
  const char* iterations_env = std::getenv("TACHYON_FUZZ_ITERATIONS");
  const int iterations = iterations_env != nullptr ? std::atoi(iterations_env) : 20000;
  std::printf("seed %u, %d mutants\n", seed, iterations);
  std::mt19937 rng(seed);

  ChatTemplateExtras extras;
  extras.bos_token = "<s>";
  extras.eos_token = "</s>";
  extras.tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object",
          "properties": {"a": {"type": ["integer", "null"], "description": "x"}}}}}])");
  extras.render.limits.max_steps = 200'000;
  extras.render.limits.max_output_bytes = 1 << 20;
  extras.render.limits.max_call_depth = 40;
  const nlohmann::ordered_json messages = fuzz_messages();

  int parsed = 0, rendered = 0;
  double slowest = 0;
  std::string slowest_source;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) {
    const std::string& base = corpus[std::uniform_int_distribution<size_t>(0, corpus.size() - 1)(rng)];
    const std::string source = mutate(base, corpus, rng);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      Result<ChatTemplate> tpl = ChatTemplate::parse(source);
      if (tpl.ok()) {
        ++parsed;
        const bool agp = (rng() & 1) != 0;
        const Result<std::string> out = apply_chat_template(*tpl, messages, agp, extras);
        if (out.ok()) {
          ++rendered;
          EXPECT_LE(out->size(), extras.render.limits.max_output_bytes);
        } else {
          EXPECT_FALSE(out.status().message().empty());
        }
      } else {
        EXPECT_FALSE(tpl.status().message().empty());
      }
    } catch (const std::exception& e) {
      // An exception is a crash to a caller that expects a Status: name the mutant that threw.
      ADD_FAILURE() << "mutant " << i << " (seed " << seed << ") threw " << e.what() << ":\n" << source;
      break;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (seconds > slowest) {
      slowest = seconds;
      slowest_source = source;
    }
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%d mutants: %d parsed, %d rendered without error; %.2f s in all, slowest %.3f s\n", iterations, parsed,
              rendered, total, slowest);
  EXPECT_LT(slowest, 10.0) << "slowest mutant (seed " << seed << "):\n" << slowest_source;
}

TEST(ChatTemplateFuzz, RandomTokenSoupNeverCrashes) {
  const uint32_t seed = fresh_seed();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  ChatTemplateRenderOptions options;
  options.limits.max_steps = 100'000;
  options.limits.max_output_bytes = 1 << 20;
  const nlohmann::ordered_json context = {{"messages", fuzz_messages()}, {"x", 1}, {"s", "str"}};
  for (int i = 0; i < 3000; ++i) {
    std::string source;
    const int n = std::uniform_int_distribution<int>(1, 40)(rng);
    for (int k = 0; k < n; ++k) {
      const char* f = kFragments[std::uniform_int_distribution<size_t>(0, std::size(kFragments) - 1)(rng)];
      source.append(f, f[0] == '\0' ? 1 : std::strlen(f));
    }
    Result<ChatTemplate> tpl = ChatTemplate::parse(source);
    if (tpl.ok()) {
      const Result<std::string> out = tpl->render(context, options);
      if (!out.ok()) {
        EXPECT_FALSE(out.status().message().empty()) << source;
      }
    }
  }
}

}  // namespace
}  // namespace tachyon::testing
