// Loaders for JSON-described tokenizers: Hugging Face tokenizer.json (+ tokenizer_config.json)
// with a BPE model, and OpenAI's GPT-2 encoder.json + vocab.bpe. What the JSON can say that
// changes the ids is honoured, refused with kUnsupported naming the field, or (the two added-token
// flags below) logged as not honoured; a malformed file is kCorruptFile naming the file and the
// field. nlohmann exceptions stay inside.
//
// Supported: model BPE (merges "a b" or ["a", "b"], byte_fallback, fuse_unk, ignore_merges,
// unk_token); normalizers Sequence, Prepend, Replace, NFC/NFD/NFKC/NFKD, Lowercase, Strip;
// pre-tokenizers Sequence, ByteLevel, Split, Metaspace, Digits, Punctuation, Whitespace,
// WhitespaceSplit; post-processors TemplateProcessing, ByteLevel, Roberta/BertProcessing,
// Sequence (for BOS/EOS); decoders for byte-level / "▁" spelling and the leading-space strip.
// Added tokens are matched on the raw text (their `normalized` flag is not applied) and
// `single_word` is not honoured (a warning names such tokens).
#include <cstdlib>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/mapped_file.h"
#include "io/json_file.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace tachyon {
namespace {

using json = nlohmann::json;

// A member that is present and not null, else nullptr.
const json* member(const json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

Result<std::string> string_member(const json& object, const char* key, const std::string& where) {
  const json* value = member(object, key);
  if (value == nullptr) return make_error(ErrorCode::kCorruptFile, "{}.{}: missing", where, key);
  if (!value->is_string()) {
    return make_error(ErrorCode::kCorruptFile, "{}.{}: expected a string, got {}", where, key, value->type_name());
  }
  return value->get<std::string>();
}

Result<bool> bool_member_or(const json& object, const char* key, bool fallback, const std::string& where) {
  const json* value = member(object, key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) {
    return make_error(ErrorCode::kCorruptFile, "{}.{}: expected true or false, got {}", where, key, value->type_name());
  }
  return value->get<bool>();
}

// A token given as "text" or {"content": "text", ...} (tokenizer_config.json writes both).
std::optional<std::string> token_text(const json* value) {
  if (value == nullptr) return std::nullopt;
  if (value->is_string()) return value->get<std::string>();
  if (value->is_object()) {
    const json* content = member(*value, "content");
    if (content != nullptr && content->is_string()) return content->get<std::string>();
  }
  return std::nullopt;
}

// Split / Replace patterns: {"String": "..."} or {"Regex": "..."}.
Result<std::shared_ptr<const Regex>> pattern_member(const json& object, const std::string& where) {
  const json* pattern = member(object, "pattern");
  if (pattern == nullptr || !pattern->is_object()) {
    return make_error(ErrorCode::kCorruptFile, "{}.pattern: expected {{\"String\": ...}} or {{\"Regex\": ...}}", where);
  }
  if (const json* s = member(*pattern, "String"); s != nullptr && s->is_string()) {
    return Regex::literal(s->get<std::string>(), where + ".pattern");
  }
  if (const json* r = member(*pattern, "Regex"); r != nullptr && r->is_string()) {
    return Regex::compile(r->get<std::string>(), where + ".pattern");
  }
  return make_error(ErrorCode::kCorruptFile, "{}.pattern: expected {{\"String\": ...}} or {{\"Regex\": ...}}", where);
}

// How deep Sequence normalizers / pre-tokenizers / post-processors / decoders may nest. Real
// files nest one or two; the parsers below recurse once per level, so a hostile file must be
// refused before they run.
constexpr int kMaxSequenceDepth = 16;

// kCorruptFile if `node`'s Sequences (children under `list_key`) nest deeper than
// kMaxSequenceDepth. Walks with an explicit stack, so it cannot overflow itself.
Status check_sequence_depth(const json* node, const char* list_key, const std::string& where) {
  std::vector<std::pair<const json*, int>> stack;
  if (node != nullptr) stack.emplace_back(node, 1);
  while (!stack.empty()) {
    const auto [at, depth] = stack.back();
    stack.pop_back();
    const json* list = member(*at, list_key);
    if (list == nullptr || !list->is_array()) continue;
    if (depth >= kMaxSequenceDepth) {
      return make_error(ErrorCode::kCorruptFile, "{}: Sequence nested deeper than {} levels (the limit)", where,
                        kMaxSequenceDepth);
    }
    for (const json& child : *list) stack.emplace_back(&child, depth + 1);
  }
  return Status::Ok();
}

bool contains_type(const json* node, const char* list_key, std::string_view type) {
  if (node == nullptr || !node->is_object()) return false;
  const json* t = member(*node, "type");
  if (t != nullptr && t->is_string() && t->get<std::string>() == type) return true;
  if (const json* list = member(*node, list_key); list != nullptr && list->is_array()) {
    for (const json& child : *list) {
      if (contains_type(&child, list_key, type)) return true;
    }
  }
  return false;
}

Status parse_normalizer(const json& node, const std::string& where, Normalizer& out) {
  TACHYON_ASSIGN_OR_RETURN(std::string type, string_member(node, "type", where));
  if (type == "Sequence") {
    const json* list = member(node, "normalizers");
    if (list == nullptr || !list->is_array()) {
      return make_error(ErrorCode::kCorruptFile, "{}.normalizers: expected an array", where);
    }
    for (size_t i = 0; i < list->size(); ++i) {
      TACHYON_RETURN_IF_ERROR(parse_normalizer((*list)[i], fmt::format("{}.normalizers[{}]", where, i), out));
    }
  } else if (type == "Prepend") {
    TACHYON_ASSIGN_OR_RETURN(std::string prefix, string_member(node, "prepend", where));
    out.add_prepend(std::move(prefix));
  } else if (type == "Replace") {
    TACHYON_ASSIGN_OR_RETURN(std::string content, string_member(node, "content", where));
    const json* pattern = member(node, "pattern");
    const json* literal = pattern != nullptr ? member(*pattern, "String") : nullptr;
    if (literal != nullptr && literal->is_string()) {
      out.add_replace(literal->get<std::string>(), std::move(content));
    } else {
      TACHYON_ASSIGN_OR_RETURN(auto regex, pattern_member(node, where));
      out.add_replace_regex(std::move(regex), std::move(content));
    }
  } else if (type == "NFC") {
    out.add_unicode(Normalizer::Form::kNfc);
  } else if (type == "NFD") {
    out.add_unicode(Normalizer::Form::kNfd);
  } else if (type == "NFKC") {
    out.add_unicode(Normalizer::Form::kNfkc);
  } else if (type == "NFKD") {
    out.add_unicode(Normalizer::Form::kNfkd);
  } else if (type == "Lowercase") {
    out.add_lowercase();
  } else if (type == "Strip") {
    TACHYON_ASSIGN_OR_RETURN(bool left, bool_member_or(node, "strip_left", true, where));
    TACHYON_ASSIGN_OR_RETURN(bool right, bool_member_or(node, "strip_right", true, where));
    out.add_strip(left, right);
  } else {
    return make_error(ErrorCode::kUnsupported, "{}.type: normalizer '{}' is not supported", where, type);
  }
  return Status::Ok();
}

constexpr std::string_view kPunctuationPattern = R"([\p{P}$+<=>^`|~])";

Status parse_pre_tokenizer(const json& node, const std::string& where, bool first, PreTokenizer& out) {
  TACHYON_ASSIGN_OR_RETURN(std::string type, string_member(node, "type", where));
  if (type == "Sequence") {
    const json* list = member(node, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return make_error(ErrorCode::kCorruptFile, "{}.pretokenizers: expected an array", where);
    }
    for (size_t i = 0; i < list->size(); ++i) {
      TACHYON_RETURN_IF_ERROR(
          parse_pre_tokenizer((*list)[i], fmt::format("{}.pretokenizers[{}]", where, i), first && i == 0, out));
    }
  } else if (type == "ByteLevel") {
    TACHYON_ASSIGN_OR_RETURN(bool add_prefix_space, bool_member_or(node, "add_prefix_space", true, where));
    TACHYON_ASSIGN_OR_RETURN(bool use_regex, bool_member_or(node, "use_regex", true, where));
    if (add_prefix_space) {
      if (!first) {
        TACHYON_LOG_WARN("{}: ByteLevel add_prefix_space after another pre-tokenizer is applied once per segment",
                         where);
      }
      out.set_transform("", " ", PrependScheme::kAlways);
    }
    if (use_regex) {
      TACHYON_ASSIGN_OR_RETURN(auto regex, Regex::compile(kGpt2Pattern, where));
      out.add_split(std::move(regex), SplitBehavior::kIsolated);
    }
  } else if (type == "Split") {
    TACHYON_ASSIGN_OR_RETURN(auto regex, pattern_member(node, where));
    TACHYON_ASSIGN_OR_RETURN(std::string behavior_name, string_member(node, "behavior", where));
    TACHYON_ASSIGN_OR_RETURN(SplitBehavior behavior, parse_split_behavior(behavior_name, where + ".behavior"));
    TACHYON_ASSIGN_OR_RETURN(bool invert, bool_member_or(node, "invert", false, where));
    out.add_split(std::move(regex), behavior, invert);
  } else if (type == "Metaspace") {
    std::string replacement = "\xE2\x96\x81";  // ▁
    if (const json* r = member(node, "replacement"); r != nullptr && r->is_string()) replacement = r->get<std::string>();
    PrependScheme scheme = PrependScheme::kAlways;
    if (const json* s = member(node, "prepend_scheme"); s != nullptr && s->is_string()) {
      const std::string name = s->get<std::string>();
      if (name == "always") {
        scheme = PrependScheme::kAlways;
      } else if (name == "first") {
        scheme = PrependScheme::kFirst;
      } else if (name == "never") {
        scheme = PrependScheme::kNever;
      } else {
        return make_error(ErrorCode::kUnsupported, "{}.prepend_scheme: unknown value '{}'", where, name);
      }
    } else {
      TACHYON_ASSIGN_OR_RETURN(bool add_prefix_space, bool_member_or(node, "add_prefix_space", true, where));
      scheme = add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
    }
    if (!first) TACHYON_LOG_WARN("{}: Metaspace after another pre-tokenizer is applied to the whole segment", where);
    out.set_transform(replacement, replacement, scheme);
    TACHYON_ASSIGN_OR_RETURN(bool split, bool_member_or(node, "split", true, where));
    if (split) {
      TACHYON_ASSIGN_OR_RETURN(auto regex, Regex::literal(replacement, where));
      out.add_split(std::move(regex), SplitBehavior::kMergedWithNext);
    }
  } else if (type == "Digits") {
    TACHYON_ASSIGN_OR_RETURN(bool individual, bool_member_or(node, "individual_digits", false, where));
    TACHYON_ASSIGN_OR_RETURN(auto regex, Regex::compile(individual ? R"(\p{N})" : R"(\p{N}+)", where));
    out.add_split(std::move(regex), SplitBehavior::kIsolated);
  } else if (type == "Punctuation") {
    SplitBehavior behavior = SplitBehavior::kIsolated;
    if (const json* b = member(node, "behavior"); b != nullptr && b->is_string()) {
      TACHYON_ASSIGN_OR_RETURN(behavior, parse_split_behavior(b->get<std::string>(), where + ".behavior"));
    }
    TACHYON_ASSIGN_OR_RETURN(auto regex, Regex::compile(kPunctuationPattern, where));
    out.add_split(std::move(regex), behavior);
  } else if (type == "Whitespace") {
    TACHYON_ASSIGN_OR_RETURN(auto regex, Regex::compile(R"(\w+|[^\w\s]+)", where));
    out.add_split(std::move(regex), SplitBehavior::kRemoved, /*invert=*/true);
  } else if (type == "WhitespaceSplit") {
    TACHYON_ASSIGN_OR_RETURN(auto regex, Regex::compile(R"(\s+)", where));
    out.add_split(std::move(regex), SplitBehavior::kRemoved);
  } else {
    return make_error(ErrorCode::kUnsupported, "{}.type: pre-tokenizer '{}' is not supported", where, type);
  }
  return Status::Ok();
}

// BOS/EOS that the post-processor puts around a single sequence.
struct PostProcessing {
  std::optional<int32_t> bos;
  std::optional<int32_t> eos;
};

Status parse_post_processor(const json& node, const std::string& where, PostProcessing& out) {
  TACHYON_ASSIGN_OR_RETURN(std::string type, string_member(node, "type", where));
  if (type == "Sequence") {
    const json* list = member(node, "processors");
    if (list == nullptr || !list->is_array()) {
      return make_error(ErrorCode::kCorruptFile, "{}.processors: expected an array", where);
    }
    for (size_t i = 0; i < list->size(); ++i) {
      TACHYON_RETURN_IF_ERROR(parse_post_processor((*list)[i], fmt::format("{}.processors[{}]", where, i), out));
    }
  } else if (type == "TemplateProcessing") {
    const json* single = member(node, "single");
    const json* specials = member(node, "special_tokens");
    if (single == nullptr || !single->is_array()) {
      return make_error(ErrorCode::kCorruptFile, "{}.single: expected an array", where);
    }
    bool after_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const json& item = (*single)[i];
      if (member(item, "Sequence") != nullptr) {
        after_sequence = true;
        continue;
      }
      const json* special = member(item, "SpecialToken");
      if (special == nullptr) continue;
      const std::string item_where = fmt::format("{}.single[{}].SpecialToken", where, i);
      TACHYON_ASSIGN_OR_RETURN(std::string name, string_member(*special, "id", item_where));
      const json* entry = specials != nullptr ? member(*specials, name.c_str()) : nullptr;
      const json* ids = entry != nullptr ? member(*entry, "ids") : nullptr;
      if (ids == nullptr || !ids->is_array() || ids->empty() || !(*ids)[0].is_number_integer()) {
        return make_error(ErrorCode::kCorruptFile, "{}.special_tokens.{}.ids: missing or not a list of ids", where,
                          name);
      }
      const auto id = (*ids)[0].get<int64_t>();
      if (id < 0 || id > INT32_MAX) {
        return make_error(ErrorCode::kCorruptFile, "{}.special_tokens.{}.ids: id {} out of range", where, name, id);
      }
      auto& slot = after_sequence ? out.eos : out.bos;
      if (!slot) slot = static_cast<int32_t>(id);
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const auto& [key, slot] : {std::pair{"cls", &out.bos}, std::pair{"sep", &out.eos}}) {
      const json* pair = member(node, key);
      if (pair == nullptr || !pair->is_array() || pair->size() != 2 || !(*pair)[1].is_number_integer()) {
        return make_error(ErrorCode::kCorruptFile, "{}.{}: expected [token, id]", where, key);
      }
      const auto id = (*pair)[1].get<int64_t>();
      if (id < 0 || id > INT32_MAX) {
        return make_error(ErrorCode::kCorruptFile, "{}.{}: id {} out of range", where, key, id);
      }
      *slot = static_cast<int32_t>(id);
    }
  } else if (type != "ByteLevel") {
    TACHYON_LOG_WARN("{}: post-processor '{}' is ignored (no BOS/EOS taken from it)", where, type);
  }
  return Status::Ok();
}

// How the decoder turns pieces back into text, for the non-byte-level case.
struct DecoderInfo {
  std::vector<std::pair<std::string, std::string>> replacements;  // applied to every piece
  bool byte_fallback = false;
  bool strip_leading_space = false;
};

void parse_decoder(const json& node, DecoderInfo& out) {
  const json* type_node = member(node, "type");
  if (type_node == nullptr || !type_node->is_string()) return;
  const std::string type = type_node->get<std::string>();
  if (type == "Sequence") {
    if (const json* list = member(node, "decoders"); list != nullptr && list->is_array()) {
      for (const json& child : *list) parse_decoder(child, out);
    }
  } else if (type == "Replace") {
    const json* pattern = member(node, "pattern");
    const json* content = member(node, "content");
    const json* s = pattern != nullptr ? member(*pattern, "String") : nullptr;
    if (s != nullptr && s->is_string() && content != nullptr && content->is_string()) {
      out.replacements.emplace_back(s->get<std::string>(), content->get<std::string>());
    }
  } else if (type == "ByteFallback") {
    out.byte_fallback = true;
  } else if (type == "Strip") {
    const json* content = member(node, "content");
    const json* start = member(node, "start");
    if (content != nullptr && content->is_string() && content->get<std::string>() == " " && start != nullptr &&
        start->is_number_integer() && start->get<int64_t>() > 0) {
      out.strip_leading_space = true;
    }
  } else if (type == "Metaspace") {
    std::string replacement = "\xE2\x96\x81";
    if (const json* r = member(node, "replacement"); r != nullptr && r->is_string()) replacement = r->get<std::string>();
    out.replacements.emplace_back(replacement, " ");
    bool strip = true;
    if (const json* s = member(node, "prepend_scheme"); s != nullptr && s->is_string()) {
      strip = s->get<std::string>() != "never";
    } else if (const json* a = member(node, "add_prefix_space"); a != nullptr && a->is_boolean()) {
      strip = a->get<bool>();
    }
    out.strip_leading_space = out.strip_leading_space || strip;
  }
}

std::string apply_replacements(std::string piece, const std::vector<std::pair<std::string, std::string>>& rules) {
  for (const auto& [from, to] : rules) {
    if (from.empty()) continue;
    size_t pos = 0;
    while ((pos = piece.find(from, pos)) != std::string::npos) {
      piece.replace(pos, from.size(), to);
      pos += to.size();
    }
  }
  return piece;
}

Result<int32_t> checked_id(const json& value, const std::string& where) {
  if (!value.is_number_integer()) {
    return make_error(ErrorCode::kCorruptFile, "{}: expected an integer id, got {}", where, value.type_name());
  }
  const auto id = value.get<int64_t>();
  if (id < 0 || id >= (int64_t{1} << 24)) {
    return make_error(ErrorCode::kCorruptFile, "{}: id {} is out of range (0..2^24)", where, id);
  }
  return static_cast<int32_t>(id);
}

// added_tokens_decoder keys are ids written as strings.
Result<int32_t> id_from_key(const std::string& key, const std::string& where) {
  char* end = nullptr;
  const long long id = std::strtoll(key.c_str(), &end, 10);
  if (key.empty() || *end != '\0' || id < 0 || id >= (1LL << 24)) {
    return make_error(ErrorCode::kCorruptFile, "{}: key is not an id in 0..2^24", where);
  }
  return static_cast<int32_t>(id);
}

// The vocabulary object {piece: id} of tokenizer.json's model or GPT-2's encoder.json.
Status read_vocab(const json& vocab, const std::string& where, bool byte_level, TokenizerParts& parts) {
  if (!vocab.is_object()) {
    return make_error(ErrorCode::kCorruptFile, "{}: expected an object {{piece: id}}, got {}", where, vocab.type_name());
  }
  BpeModel& model = parts.model;
  const size_t id_bound = max_token_id_bound(vocab.size());
  for (const auto& [piece, value] : vocab.items()) {
    TACHYON_ASSIGN_OR_RETURN(int32_t id, checked_id(value, fmt::format("{}[\"{}\"]", where, excerpt(piece))));
    if (static_cast<size_t>(id) >= id_bound) {
      return make_error(ErrorCode::kCorruptFile, "{}[\"{}\"]: id {} is far beyond the {} pieces defined (ids must stay below {})",
                        where, excerpt(piece), id, vocab.size(), id_bound);
    }
    if (static_cast<size_t>(id) < model.pieces.size() && !model.pieces[static_cast<size_t>(id)].empty()) {
      return make_error(ErrorCode::kCorruptFile, "{}: id {} is used by '{}' and '{}'", where, id,
                        excerpt(model.pieces[static_cast<size_t>(id)]), excerpt(piece));
    }
    std::string text = piece;
    if (byte_level) {
      // A piece outside the byte-level alphabet (e.g. an added token) is kept as written.
      if (auto raw = byte_level_decode(piece)) text = std::move(*raw);
    }
    if (text.empty()) return make_error(ErrorCode::kCorruptFile, "{}: id {} has an empty piece", where, id);
    model.set_piece(id, std::move(text));
  }
  if (model.pieces.empty()) return make_error(ErrorCode::kCorruptFile, "{}: the vocabulary is empty", where);
  return Status::Ok();
}

// Merges as "left right" strings or ["left", "right"] pairs, in priority order.
Status read_merges(const json& merges, const std::string& where, bool byte_level, BpeModel& model) {
  if (!merges.is_array()) {
    return make_error(ErrorCode::kCorruptFile, "{}: expected an array, got {}", where, merges.type_name());
  }
  size_t skipped = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string left, right;
    if (m.is_string()) {
      const std::string text = m.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        return make_error(ErrorCode::kCorruptFile, "{}[{}]: '{}' is not two pieces separated by one space", where, i,
                          excerpt(text));
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return make_error(ErrorCode::kCorruptFile, "{}[{}]: expected \"a b\" or [\"a\", \"b\"]", where, i);
    }
    if (byte_level) {
      if (auto raw = byte_level_decode(left)) left = std::move(*raw);
      if (auto raw = byte_level_decode(right)) right = std::move(*raw);
    }
    if (!model.add_merge(left, right, static_cast<int32_t>(i))) ++skipped;
  }
  if (skipped > 0) {
    TACHYON_LOG_WARN("{}: {} of {} merges name pieces outside the vocabulary and are ignored", where, skipped,
                     merges.size());
  }
  return Status::Ok();
}

Status load_hf_config(const std::string& config_path, const std::string& json_path, const PostProcessing& post,
                      TokenizerParts& parts) {
  auto lookup = [&](const std::string& text) -> std::optional<int32_t> {
    for (const AddedToken& t : parts.added_tokens) {
      if (t.content == text) return t.id;
    }
    std::string key = text;
    if (parts.byte_level_spelling) {
      if (auto raw = byte_level_decode(text)) key = std::move(*raw);
    }
    const int32_t id = parts.model.find(key);
    return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
  };

  std::optional<bool> add_bos, add_eos;
  std::optional<int32_t> bos = post.bos, eos = post.eos;
  if (!config_path.empty()) {
    TACHYON_ASSIGN_OR_RETURN(json config, read_json_file(config_path));
    if (!config.is_object()) {
      return make_error(ErrorCode::kCorruptFile, "{}: expected a JSON object, got {}", config_path, config.type_name());
    }
    // Added tokens declared only in the config.
    if (const json* decoder = member(config, "added_tokens_decoder"); decoder != nullptr && decoder->is_object()) {
      std::unordered_set<int32_t> known;  // a set, not a scan: files list 200k tokens
      for (const AddedToken& t : parts.added_tokens) known.insert(t.id);
      for (const auto& [key, value] : decoder->items()) {
        const std::string where = fmt::format("{}: added_tokens_decoder[\"{}\"]", config_path, excerpt(key));
        TACHYON_ASSIGN_OR_RETURN(int32_t id, id_from_key(key, where));
        if (!known.insert(id).second) continue;
        TACHYON_ASSIGN_OR_RETURN(std::string content, string_member(value, "content", where));
        TACHYON_ASSIGN_OR_RETURN(bool special, bool_member_or(value, "special", true, where));
        TACHYON_ASSIGN_OR_RETURN(bool lstrip, bool_member_or(value, "lstrip", false, where));
        TACHYON_ASSIGN_OR_RETURN(bool rstrip, bool_member_or(value, "rstrip", false, where));
        parts.added_tokens.push_back(AddedToken{content, id, special, lstrip, rstrip});
      }
    }
    for (const auto& [key, slot] : {std::pair{"add_bos_token", &add_bos}, std::pair{"add_eos_token", &add_eos}}) {
      if (const json* v = member(config, key); v != nullptr) {
        if (!v->is_boolean()) {
          return make_error(ErrorCode::kCorruptFile, "{}: {}: expected true or false, got {}", config_path, key,
                            v->type_name());
        }
        *slot = v->get<bool>();
      }
    }
    for (const auto& [key, slot] : {std::pair{"bos_token", &bos}, std::pair{"eos_token", &eos}}) {
      if (const auto text = token_text(member(config, key))) {
        if (const auto id = lookup(*text)) {
          *slot = *id;
        } else {
          TACHYON_LOG_WARN("{}: {} '{}' is not in the vocabulary of {}; ignored", config_path, key, *text, json_path);
        }
      }
    }
    if (const json* chat = member(config, "chat_template"); chat != nullptr) {
      if (chat->is_string()) {
        parts.chat_template = chat->get<std::string>();
      } else if (chat->is_array()) {
        // [{"name": ..., "template": ...}]: the one named "default", else the first.
        for (const json& entry : *chat) {
          const json* name = member(entry, "name");
          const json* text = member(entry, "template");
          if (text == nullptr || !text->is_string()) continue;
          const bool is_default = name != nullptr && name->is_string() && name->get<std::string>() == "default";
          if (parts.chat_template.empty() || is_default) parts.chat_template = text->get<std::string>();
          if (is_default) break;
        }
      }
    }
  }
  parts.bos_id = bos.value_or(-1);
  if (eos) parts.eos_ids = {*eos};
  parts.add_bos = add_bos.value_or(post.bos.has_value());
  parts.add_eos = add_eos.value_or(post.eos.has_value());
  return Status::Ok();
}

Result<std::unique_ptr<Tokenizer>> load_hf_json(const std::string& json_path, const std::string& config_path) {
  TACHYON_ASSIGN_OR_RETURN(json root, read_json_file(json_path));
  if (!root.is_object()) {
    return make_error(ErrorCode::kCorruptFile, "{}: expected a JSON object, got {}", json_path, root.type_name());
  }
  const json* model_node = member(root, "model");
  if (model_node == nullptr || !model_node->is_object()) {
    return make_error(ErrorCode::kCorruptFile, "{}: model: missing or not an object", json_path);
  }
  const std::string model_where = json_path + ": model";
  std::string type = "BPE";  // old files leave it out
  if (const json* t = member(*model_node, "type"); t != nullptr) {
    if (!t->is_string()) return make_error(ErrorCode::kCorruptFile, "{}.type: expected a string", model_where);
    type = t->get<std::string>();
  } else if (member(*model_node, "merges") == nullptr) {
    return make_error(ErrorCode::kUnsupported, "{}.type: missing and no merges; only BPE models are supported",
                      model_where);
  }
  if (type != "BPE") {
    return make_error(ErrorCode::kUnsupported, "{}.type: '{}' is not supported (only BPE)", model_where, type);
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const json* v = member(*model_node, key); v != nullptr && v->is_string() && !v->get<std::string>().empty()) {
      return make_error(ErrorCode::kUnsupported, "{}.{}: '{}' is not supported", model_where, key, v->get<std::string>());
    }
  }
  if (const json* d = member(*model_node, "dropout"); d != nullptr && d->is_number() && d->get<double>() > 0.0) {
    TACHYON_LOG_WARN("{}.dropout: {} is a training option; encoding is deterministic", model_where, d->get<double>());
  }

  const json* pre_node = member(root, "pre_tokenizer");
  const json* decoder_node = member(root, "decoder");
  const json* normalizer_node = member(root, "normalizer");
  const json* post_node = member(root, "post_processor");
  TACHYON_RETURN_IF_ERROR(check_sequence_depth(normalizer_node, "normalizers", json_path + ": normalizer"));
  TACHYON_RETURN_IF_ERROR(check_sequence_depth(pre_node, "pretokenizers", json_path + ": pre_tokenizer"));
  TACHYON_RETURN_IF_ERROR(check_sequence_depth(post_node, "processors", json_path + ": post_processor"));
  TACHYON_RETURN_IF_ERROR(check_sequence_depth(decoder_node, "decoders", json_path + ": decoder"));
  const bool byte_level =
      contains_type(pre_node, "pretokenizers", "ByteLevel") || contains_type(decoder_node, "decoders", "ByteLevel");

  TokenizerParts parts;
  parts.source = fmt::format("tokenizer.json ({})", json_path);
  parts.byte_level_spelling = byte_level;
  BpeModel& model = parts.model;
  model.rank_source = BpeRankSource::kPairRanks;
  model.unit = byte_level ? BpeUnit::kByte : BpeUnit::kCodePoint;
  const json* vocab = member(*model_node, "vocab");
  if (vocab == nullptr) return make_error(ErrorCode::kCorruptFile, "{}.vocab: missing", model_where);
  TACHYON_RETURN_IF_ERROR(read_vocab(*vocab, model_where + ".vocab", byte_level, parts));
  const json* merges = member(*model_node, "merges");
  if (merges == nullptr) return make_error(ErrorCode::kCorruptFile, "{}.merges: missing", model_where);
  TACHYON_RETURN_IF_ERROR(read_merges(*merges, model_where + ".merges", byte_level, model));
  TACHYON_ASSIGN_OR_RETURN(bool byte_fallback, bool_member_or(*model_node, "byte_fallback", false, model_where));
  TACHYON_ASSIGN_OR_RETURN(model.fuse_unk, bool_member_or(*model_node, "fuse_unk", false, model_where));
  TACHYON_ASSIGN_OR_RETURN(model.ignore_merges, bool_member_or(*model_node, "ignore_merges", false, model_where));
  if (const json* unk = member(*model_node, "unk_token"); unk != nullptr && unk->is_string()) {
    model.unk_id = model.find(unk->get<std::string>());
  }

  // Added tokens.
  if (const json* added = member(root, "added_tokens"); added != nullptr) {
    if (!added->is_array()) return make_error(ErrorCode::kCorruptFile, "{}: added_tokens: expected an array", json_path);
    for (size_t i = 0; i < added->size(); ++i) {
      const json& t = (*added)[i];
      const std::string where = fmt::format("{}: added_tokens[{}]", json_path, i);
      const json* id_node = member(t, "id");
      if (id_node == nullptr) return make_error(ErrorCode::kCorruptFile, "{}.id: missing", where);
      TACHYON_ASSIGN_OR_RETURN(int32_t id, checked_id(*id_node, where + ".id"));
      TACHYON_ASSIGN_OR_RETURN(std::string content, string_member(t, "content", where));
      TACHYON_ASSIGN_OR_RETURN(bool special, bool_member_or(t, "special", false, where));
      TACHYON_ASSIGN_OR_RETURN(bool lstrip, bool_member_or(t, "lstrip", false, where));
      TACHYON_ASSIGN_OR_RETURN(bool rstrip, bool_member_or(t, "rstrip", false, where));
      TACHYON_ASSIGN_OR_RETURN(bool single_word, bool_member_or(t, "single_word", false, where));
      if (single_word) {
        TACHYON_LOG_WARN("{}: single_word is not honoured; '{}' is matched inside words too", where, excerpt(content));
      }
      parts.added_tokens.push_back(AddedToken{std::move(content), id, special, lstrip, rstrip});
    }
  }

  // Token types and the bytes each id decodes to.
  DecoderInfo decoder;
  if (decoder_node != nullptr) parse_decoder(*decoder_node, decoder);
  parts.token_bytes.resize(model.pieces.size());
  parts.token_types.assign(model.pieces.size(), TokenType::kNormal);
  const bool decode_bytes = byte_fallback || decoder.byte_fallback;
  for (size_t id = 0; id < model.pieces.size(); ++id) {
    const std::string& piece = model.pieces[id];
    if (piece.empty()) {
      parts.token_types[id] = TokenType::kUnused;
    } else if (byte_level) {
      parts.token_bytes[id] = piece;  // already raw bytes
    } else if (const auto byte = parse_byte_token(piece); byte && decode_bytes) {
      parts.token_bytes[id] = std::string(1, static_cast<char>(*byte));
      parts.token_types[id] = TokenType::kByte;
    } else {
      parts.token_bytes[id] = apply_replacements(piece, decoder.replacements);
    }
  }
  if (model.unk_id >= 0) parts.token_types[static_cast<size_t>(model.unk_id)] = TokenType::kUnknown;
  if (byte_fallback) {
    model.index_byte_fallback([&](int32_t id) { return parts.token_types[static_cast<size_t>(id)] == TokenType::kByte; });
  }
  parts.strip_leading_space = !byte_level && decoder.strip_leading_space;
  parts.kind = byte_level ? TokenizerKind::kByteLevelBpe : TokenizerKind::kSentencePieceBpe;

  if (normalizer_node != nullptr) {
    TACHYON_RETURN_IF_ERROR(parse_normalizer(*normalizer_node, json_path + ": normalizer", parts.normalizer));
  }
  if (pre_node != nullptr) {
    TACHYON_RETURN_IF_ERROR(parse_pre_tokenizer(*pre_node, json_path + ": pre_tokenizer", true, parts.pre_tokenizer));
  }
  PostProcessing post;
  if (post_node != nullptr) {
    TACHYON_RETURN_IF_ERROR(parse_post_processor(*post_node, json_path + ": post_processor", post));
  }
  TACHYON_RETURN_IF_ERROR(load_hf_config(config_path, json_path, post, parts));
  return Tokenizer::assemble(std::move(parts));
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_hf_json(const std::string& tokenizer_json_path,
                                                           const std::string& tokenizer_config_path) {
  try {
    return load_hf_json(tokenizer_json_path, tokenizer_config_path);
  } catch (const std::exception& e) {
    // Defensive: every access above checks types first.
    return make_error(ErrorCode::kCorruptFile, "{}: unexpected content: {}", tokenizer_json_path, e.what());
  }
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gpt2_files(const std::string& encoder_json_path,
                                                              const std::string& vocab_bpe_path) {
  try {
    TACHYON_ASSIGN_OR_RETURN(json encoder, read_json_file(encoder_json_path));
    TokenizerParts parts;
    parts.kind = TokenizerKind::kByteLevelBpe;
    parts.source = fmt::format("GPT-2 encoder.json + vocab.bpe ({}, {})", encoder_json_path, vocab_bpe_path);
    parts.byte_level_spelling = true;
    parts.model.rank_source = BpeRankSource::kPairRanks;
    parts.model.unit = BpeUnit::kByte;
    TACHYON_RETURN_IF_ERROR(read_vocab(encoder, encoder_json_path, true, parts));

    TACHYON_ASSIGN_OR_RETURN(std::string merges_text, read_text_file(vocab_bpe_path));
    json merges = json::array();
    size_t pos = 0;
    size_t line_number = 0;
    while (pos < merges_text.size()) {
      size_t end = merges_text.find('\n', pos);
      if (end == std::string::npos) end = merges_text.size();
      std::string line = merges_text.substr(pos, end - pos);
      pos = end + 1;
      ++line_number;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
      if (!is_valid_utf8(line)) {
        return make_error(ErrorCode::kCorruptFile, "{}: line {} is not valid UTF-8", vocab_bpe_path, line_number);
      }
      merges.push_back(std::move(line));
    }
    TACHYON_RETURN_IF_ERROR(read_merges(merges, vocab_bpe_path, true, parts.model));

    parts.token_bytes = parts.model.pieces;
    parts.token_types.assign(parts.model.pieces.size(), TokenType::kNormal);
    // GPT-2's one special token sits in encoder.json.
    if (const int32_t eot = parts.model.find("<|endoftext|>"); eot >= 0) {
      parts.added_tokens.push_back(AddedToken{"<|endoftext|>", eot, true});
      parts.bos_id = eot;
      parts.eos_ids = {eot};
    }
    TACHYON_ASSIGN_OR_RETURN(auto regex, Regex::compile(kGpt2Pattern, "GPT-2 pre-tokenizer"));
    parts.pre_tokenizer.add_split(std::move(regex), SplitBehavior::kIsolated);
    return assemble(std::move(parts));
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kCorruptFile, "{}: unexpected content: {}", encoder_json_path, e.what());
  }
}

Result<std::map<std::string, int32_t>> read_hf_special_tokens(const std::string& tokenizer_config_path) {
  TACHYON_ASSIGN_OR_RETURN(json config, read_json_file(tokenizer_config_path));
  const json* decoder = member(config, "added_tokens_decoder");
  if (decoder == nullptr || !decoder->is_object()) {
    return make_error(ErrorCode::kNotFound, "{}: added_tokens_decoder: missing or not an object",
                      tokenizer_config_path);
  }
  std::map<std::string, int32_t> out;
  for (const auto& [key, value] : decoder->items()) {
    const std::string where = fmt::format("{}: added_tokens_decoder[\"{}\"]", tokenizer_config_path, key);
    TACHYON_ASSIGN_OR_RETURN(int32_t id, id_from_key(key, where));
    TACHYON_ASSIGN_OR_RETURN(std::string content, string_member(value, "content", where));
    out.emplace(std::move(content), id);
  }
  return out;
}

}  // namespace tachyon
