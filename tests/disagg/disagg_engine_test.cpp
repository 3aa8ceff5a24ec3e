// Disaggregated vs colocated on the bundled model: 32 prompts of mixed lengths (some past one KV
// block, eight sharing a prefix) run on a prefill engine, their KV go over TCP on loopback to a
// decode engine, which adopts them and generates the rest. The tokens and the text must equal,
// token for token, what one engine produces alone — greedy and seeded sampling, with the two
// sides' caches of different sizes and block sizes. Corrupted payloads, peers that close or
// stall, and a model of another shape are clean errors, and no engine leaks a block. Linear
// layers are batch-invariant, so that "equal" is exact whatever else shares a step.
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/mapped_file.h"
#include "disagg/kv_export.h"
#include "disagg/kv_staging.h"
#include "disagg/kv_transfer.h"
#include "disagg/tcp_transport.h"
#include "engine/engine.h"
#include "model/model_loader.h"
#include "test_util.h"

namespace tachyon::disagg {
namespace {

struct Case {
  std::vector<int32_t> prompt;
  GenerationParams params;
};

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;
  std::string first_text;  // the text that came with the first token
  FinishReason reason = FinishReason::kLength;
};

struct DisaggResult {
  std::vector<Outcome> outcomes;   // in case order
  int num_transferred = 0;
  int num_in_regions = 0;         // of them, exported into the arena's memory
  int num_adopt_retries = 0;      // adopt() had no room yet
  EngineStats prefill, decode;
};

// Wraps a transport and flips one byte of the n-th message it sends.
class CorruptingTransport final : public KvTransport {
 public:
  CorruptingTransport(KvTransport& inner, int message, size_t byte) : inner_(inner), target_(message), byte_(byte) {}
  Status send(std::span<const uint8_t> message, Millis timeout) override {
    if (count_++ != target_) return inner_.send(message, timeout);
    std::vector<uint8_t> bad(message.begin(), message.end());
    bad[byte_ % bad.size()] ^= 0x01;
    return inner_.send(bad, timeout);
  }
  Result<std::vector<uint8_t>> receive(size_t max_bytes, Millis timeout) override {
    return inner_.receive(max_bytes, timeout);
  }
  void close() override { inner_.close(); }

 private:
  KvTransport& inner_;
  int target_;
  size_t byte_;
  int count_ = 0;
};

struct TcpPair {
  std::unique_ptr<TcpKvTransport> prefill_end;  // connects
  std::unique_ptr<TcpKvTransport> decode_end;   // accepts
};

TcpPair connect_pair() {
  TcpPair p;
  auto listener = TcpKvListener::listen("127.0.0.1", 0);
  EXPECT_TRUE(listener.ok()) << listener.status().to_string();
  if (!listener.ok()) return p;
  auto c = TcpKvTransport::connect("127.0.0.1", (*listener)->port(), Millis(2000));
  auto s = (*listener)->accept(Millis(2000));
  EXPECT_TRUE(c.ok() && s.ok());
  if (c.ok() && s.ok()) {
    p.prefill_end = std::move(c).value();
    p.decode_end = std::move(s).value();
  }
  return p;
}

void expect_no_leaks(const Engine& e, const char* what) {
  const Status st = e.check_no_leaks();
  EXPECT_TRUE(st.ok()) << what << ": " << st.to_string();
  EXPECT_EQ(e.stats().kv_blocks_used, 0) << what;
}

class DisaggTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    LoadOptions o;
    o.path = testing::source_dir() + "/models/tachyon-demo";
    auto m = load_model(o);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = new LoadedModel(std::move(m).value());
    auto code = read_text_file(testing::source_dir() + "/tests/data/eval/code.txt");
    auto prose = read_text_file(testing::source_dir() + "/tests/data/eval/prose.txt");
    ASSERT_TRUE(code.ok() && prose.ok());
    // 32 prompts of 1 to ~60 tokens; the last eight share a 100-byte prefix (more than a block).
    const std::string shared_prefix = prose->substr(20000, 100);
    for (int i = 0; i < 32; ++i) {
      const std::string& src = i % 2 == 0 ? *code : *prose;
      const size_t len = static_cast<size_t>(i == 0 ? 1 : (i * 89) % 110 + 3);
      std::string text = src.substr(static_cast<size_t>(i) * 3011 % (src.size() - 1000), len);
      if (i >= 24) text = shared_prefix + text.substr(0, static_cast<size_t>(i * 2));
      Case c;
      c.prompt = model_->tokenizer->encode(text);
      c.params.sampling.temperature = 0.0f;
      c.params.max_tokens = 2 + (i * 7) % 6;
      greedy_.push_back(c);
      c.params.sampling.temperature = 0.9f;
      c.params.sampling.top_p = 0.95f;
      c.params.sampling.repetition_penalty = 1.1f;
      c.params.sampling.seed = 500 + static_cast<uint64_t>(i);
      seeded_.push_back(c);
    }
  }
  // What one engine produces for every case (computed on first use).
  static const std::vector<Outcome>& greedy_colocated() {
    if (greedy_colocated_ == nullptr) greedy_colocated_ = new std::vector<Outcome>(run_colocated(greedy_));
    return *greedy_colocated_;
  }
  static const std::vector<Outcome>& seeded_colocated() {
    if (seeded_colocated_ == nullptr) seeded_colocated_ = new std::vector<Outcome>(run_colocated(seeded_));
    return *seeded_colocated_;
  }
  static void TearDownTestSuite() {
    delete greedy_colocated_;
    delete seeded_colocated_;
    greedy_colocated_ = seeded_colocated_ = nullptr;
    delete model_;
    greedy_.clear();
    seeded_.clear();
  }

  static EngineOptions base_options() {
    EngineOptions o;
    o.max_model_len = 512;
    o.kv.num_blocks = 512 / 16 * 32;
    o.scheduler.max_batched_tokens = 512;
    o.scheduler.max_seqs = 32;
    o.batch_invariant = true;
    return o;
  }

  static std::unique_ptr<Engine> make(const EngineOptions& o, const LoadedModel& m = *model_) {
    auto e = Engine::create(*m.model, m.tokenizer.get(), m.eos_token_ids, o);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(e).value() : nullptr;
  }

  static void collect(const RequestOutput& o, Outcome& r) {
    if (r.tokens.empty()) r.first_text = o.text;
    r.tokens.insert(r.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    r.text += o.text;
    if (o.finished) r.reason = o.finish_reason;
  }

  static std::vector<Outcome> run_colocated(const std::vector<Case>& cases, const EngineOptions& o = base_options()) {
    auto e = make(o);
    std::map<RequestId, size_t> index;
    for (size_t i = 0; i < cases.size(); ++i) {
      auto id = e->add_request(cases[i].prompt, cases[i].params);
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      index[*id] = i;
    }
    std::vector<Outcome> out(cases.size());
    while (e->has_unfinished()) {
      auto step = e->step();
      EXPECT_TRUE(step.ok()) << step.status().to_string();
      if (!step.ok()) break;
      for (const RequestOutput& o : *step) collect(o, out[index[o.id]]);
    }
    expect_no_leaks(*e, "colocated");
    return out;
  }

  // Runs every prompt on `prefill` with prefill_only, exports each transferred request and sends
  // it on `send_end` as soon as it is done; a thread receives on `receive_end`. Then the decode
  // engine adopts the imports one per step (retrying those it has no room for yet) and runs
  // until idle. Returns every case's tokens and text, the prefill side's first, then the decode
  // side's.
  // With `arena`, exports go into its regions where it has room, and `map_region` stands for the
  // receiver's mapping of them; the exports (and so their regions) live until the decode side
  // adopted everything, as a sender keeps them until the ack.
  static DisaggResult run_disaggregated(const std::vector<Case>& cases, Engine& prefill, Engine& decode,
                                        KvTransport& send_end, KvTransport& receive_end,
                                        KvExportArena* arena = nullptr,
                                        decltype(KvReceiveOptions::map_region) map_region = {}) {
    DisaggResult result;
    result.outcomes.resize(cases.size());
    std::vector<ReceivedKv> received;
    std::vector<KvExport> sent_exports;
    Status receive_end_status;
    std::thread receiver([&] {
      KvReceiveOptions o;
      o.wait_timeout = Millis(20000);
      o.timeout = Millis(5000);
      o.expect = kv_model_shape(decode);
      o.map_region = map_region;
      for (;;) {
        auto r = receive_kv(receive_end, o);
        if (!r.ok()) {
          receive_end_status = r.status();
          return;
        }
        received.push_back(std::move(r).value());
      }
    });

    std::map<RequestId, size_t> index;
    for (size_t i = 0; i < cases.size(); ++i) {
      GenerationParams p = cases[i].params;
      p.prefill_only = true;
      auto id = prefill.add_request(cases[i].prompt, p);
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      index[*id] = i;
    }
    while (prefill.has_unfinished()) {
      auto step = prefill.step();
      EXPECT_TRUE(step.ok()) << step.status().to_string();
      if (!step.ok()) break;
      for (const RequestOutput& o : *step) {
        const size_t i = index[o.id];
        collect(o, result.outcomes[i]);
        EXPECT_TRUE(o.finished) << "a prefill-only request ends at its first token";
        EXPECT_EQ(o.new_token_ids.size(), 1u);
        if (o.finish_reason != FinishReason::kTransfer) continue;  // a stop at the first token
        auto kv = export_kv(prefill, o.id, arena);
        EXPECT_TRUE(kv.ok()) << kv.status().to_string();
        if (!kv.ok()) continue;
        const Status sent = send_kv(send_end, *kv, i, Millis(5000));
        EXPECT_TRUE(sent.ok()) << sent.to_string();
        ++result.num_transferred;
        if (kv->device) ++result.num_in_regions;
        sent_exports.push_back(std::move(kv).value());
      }
    }
    result.prefill = prefill.stats();
    expect_no_leaks(prefill, "prefill side");
    send_end.close();  // ends the receiver's loop
    receiver.join();
    EXPECT_EQ(receive_end_status.code(), ErrorCode::kIo) << receive_end_status.to_string();
    EXPECT_EQ(received.size(), static_cast<size_t>(result.num_transferred));

    std::deque<ReceivedKv> pending(std::make_move_iterator(received.begin()), std::make_move_iterator(received.end()));
    std::map<RequestId, size_t> decode_index;
    for (int guard = 0; !pending.empty() || decode.has_unfinished(); ++guard) {
      if (guard > 100000) {
        ADD_FAILURE() << "the decode engine does not finish";
        break;
      }
      if (!pending.empty()) {
        const ReceivedKv& r = pending.front();
        auto id = adopt(decode, r.kv, cases[r.transfer_id].params);
        if (id.ok()) {
          decode_index[*id] = r.transfer_id;
          pending.pop_front();
        } else {
          // Backpressure: no blocks or sequence slots now; retried after a step frees some.
          ++result.num_adopt_retries;
          EXPECT_EQ(id.status().code(), ErrorCode::kOutOfRange) << id.status().to_string();
          EXPECT_TRUE(decode.has_unfinished()) << "nothing running, yet no room: " << id.status().to_string();
          if (!decode.has_unfinished()) break;
        }
      }
      auto step = decode.step();
      EXPECT_TRUE(step.ok()) << step.status().to_string();
      if (!step.ok()) break;
      for (const RequestOutput& o : *step) {
        collect(o, result.outcomes[decode_index.at(o.id)]);
        if (o.finished && o.finish_reason != FinishReason::kAbort) {
          EXPECT_EQ(o.timing.token_times.size(), static_cast<size_t>(o.num_generated_tokens));
        }
      }
    }
    result.decode = decode.stats();
    expect_no_leaks(decode, "decode side");
    received.clear();
    sent_exports.clear();  // the regions go back to the arena
    return result;
  }

  static DisaggResult run_over_tcp(const std::vector<Case>& cases, const EngineOptions& prefill_options,
                                   const EngineOptions& decode_options) {
    auto prefill = make(prefill_options);
    auto decode = make(decode_options);
    TcpPair tcp = connect_pair();
    if (!prefill || !decode || !tcp.prefill_end) return {};
    return run_disaggregated(cases, *prefill, *decode, *tcp.prefill_end, *tcp.decode_end);
  }

  static void expect_same(const std::vector<Outcome>& got, const std::vector<Outcome>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << what << ": prompt " << i;
      EXPECT_EQ(got[i].text, want[i].text) << what << ": prompt " << i;
      EXPECT_EQ(got[i].reason, want[i].reason) << what << ": prompt " << i;
    }
  }

  // Every other case (sixteen, four of them sharing the prefix), for the tests whose point is
  // not the mix.
  static std::vector<Case> odd_cases(const std::vector<Case>& all) {
    std::vector<Case> odd;
    for (size_t i = 1; i < all.size(); i += 2) odd.push_back(all[i]);
    return odd;
  }

  // One prompt's export from a fresh prefill engine (the case's own params, prefill-only).
  static KvExport export_one(const Case& c, const EngineOptions& o = base_options()) {
    auto prefill = make(o);
    GenerationParams p = c.params;
    p.prefill_only = true;
    auto id = prefill->add_request(c.prompt, p);
    EXPECT_TRUE(id.ok());
    while (prefill->has_unfinished()) {
      auto step = prefill->step();
      EXPECT_TRUE(step.ok());
      if (!step.ok()) break;
    }
    EXPECT_EQ(prefill->stats().num_transferring, 1);
    auto kv = export_kv(*prefill, *id);
    EXPECT_TRUE(kv.ok()) << kv.status().to_string();
    expect_no_leaks(*prefill, "export_one");
    return kv.ok() ? std::move(kv).value() : KvExport{};
  }

  static LoadedModel* model_;
  static std::vector<Case> greedy_, seeded_;
  static std::vector<Outcome>* greedy_colocated_;
  static std::vector<Outcome>* seeded_colocated_;
};

LoadedModel* DisaggTest::model_ = nullptr;
std::vector<Case> DisaggTest::greedy_, DisaggTest::seeded_;
std::vector<Outcome>* DisaggTest::greedy_colocated_ = nullptr;
std::vector<Outcome>* DisaggTest::seeded_colocated_ = nullptr;

TEST_F(DisaggTest, PromptsAreMixed) {
  size_t shortest = 1 << 20, longest = 0, past_one_block = 0;
  for (const Case& c : greedy_) {
    shortest = std::min(shortest, c.prompt.size());
    longest = std::max(longest, c.prompt.size());
    past_one_block += c.prompt.size() > 16;
  }
  EXPECT_LE(shortest, 2u);
  EXPECT_GE(longest, 40u);
  EXPECT_GE(past_one_block, 16u);
  for (size_t i = 24; i < 32; ++i) {  // more than one full block in common
    ASSERT_GE(greedy_[i].prompt.size(), 25u);
    EXPECT_TRUE(std::equal(greedy_[24].prompt.begin(), greedy_[24].prompt.begin() + 24, greedy_[i].prompt.begin()));
  }
}

TEST_F(DisaggTest, GreedyOverTcpEqualsColocated) {
  const DisaggResult r = run_over_tcp(greedy_, base_options(), base_options());
  expect_same(r.outcomes, greedy_colocated(), "greedy");
  EXPECT_GE(r.num_transferred, 28);
  // The decode side never ran a prompt: its only forward tokens are decodes.
  EXPECT_EQ(r.decode.prompt_tokens_computed, 0);
  EXPECT_EQ(r.decode.num_preemptions, 0);
  // The shared prefix: later imports find its full blocks in the decode side's prefix cache.
  EXPECT_GT(r.decode.prefix.hit_tokens, 0);
}

// Quantized caches move codes and scales together: a decode side adopting i8 / f8e4m3 K/V
// continues exactly as a colocated engine with the same cache dtype.
TEST_F(DisaggTest, QuantizedCachesOverTcpEqualColocated) {
  for (DType dtype : {DType::kI8, DType::kF8E4M3}) {
    SCOPED_TRACE(dtype_name(dtype));
    EngineOptions o = base_options();
    o.kv.dtype = dtype;
    const std::vector<Case> cases = odd_cases(greedy_);
    const std::vector<Outcome> colocated = run_colocated(cases, o);
    const DisaggResult r = run_over_tcp(cases, o, o);
    expect_same(r.outcomes, colocated, dtype_name(dtype));
    EXPECT_GE(r.num_transferred, 12);
    EXPECT_EQ(r.decode.prompt_tokens_computed, 0);
  }
  // An i8 export is refused by an engine with an f32 cache.
  EngineOptions i8 = base_options();
  i8.kv.dtype = DType::kI8;
  const KvExport kv = export_one(greedy_[5], i8);
  EXPECT_EQ(kv.layers[0].size(), static_cast<size_t>(kv.num_computed) * 2 * kv.num_kv_heads * (kv.head_dim + 4));
  auto plain = make(base_options());
  EXPECT_EQ(adopt(*plain, kv, greedy_[5].params).status().code(), ErrorCode::kInvalidArgument);
  expect_no_leaks(*plain, "f32 cache");
}

// Long prompts under KV tiers (window 32): the prefill side retires their older blocks while the
// prompt runs, and the transfer carries what it holds: the window's blocks alone (drop), or the
// history blocks' rows too (int8 / int4), with their key bounds where sparse attention reads them.
// The decode side continues exactly as a colocated engine with the same tiers; nothing leaks on
// either side (the history pool included).
TEST_F(DisaggTest, KvTiersOverTcpEqualColocated) {
  std::vector<Case> cases;
  auto prose = read_text_file(testing::source_dir() + "/tests/data/eval/prose.txt");
  ASSERT_TRUE(prose.ok());
  for (int i = 0; i < 6; ++i) {
    Case c;
    const size_t length = 300 + 150 * static_cast<size_t>(i);
    c.prompt = model_->tokenizer->encode(prose->substr(static_cast<size_t>(i) * 7919, length));
    c.params.sampling.temperature = 0.0f;
    c.params.max_tokens = 24;
    c.params.ignore_eos = true;
    cases.push_back(c);
  }
  struct Tier {
    KvHistory history;
    int sparse_budget;
  };
  for (const Tier tier : {Tier{KvHistory::kDrop, 0}, Tier{KvHistory::kInt8, 0}, Tier{KvHistory::kInt4, 0},
                          Tier{KvHistory::kInt4, 32}}) {
    const std::string what =
        fmt::format("history {}, sparse budget {}", kv_history_name(tier.history), tier.sparse_budget);
    SCOPED_TRACE(what);
    EngineOptions o = base_options();
    o.kv.tiers = KvTierOptions{32, tier.history};
    o.sparse_budget = tier.sparse_budget;
    const std::vector<Outcome> colocated = run_colocated(cases, o);
    const DisaggResult r = run_over_tcp(cases, o, o);
    expect_same(r.outcomes, colocated, what.c_str());
    EXPECT_EQ(r.num_transferred, static_cast<int>(cases.size()));
    EXPECT_EQ(r.decode.prompt_tokens_computed, 0);
    if (tier.history != KvHistory::kDrop) {
      // Every prompt left history behind, which the export carried.
      const KvExport kv = export_one(cases[0], o);
      EXPECT_EQ(kv.history_bits, tier.history == KvHistory::kInt8 ? 8 : 4);
      EXPECT_EQ(kv.key_bounds, tier.sparse_budget > 0);
      EXPECT_GE(kv.history_blocks(), 2);
      EXPECT_EQ(kv.first_position, kv.history_blocks() * 16);
      EXPECT_EQ(kv.layers[0].size(), kv.layer_bytes());
      // An engine that keeps no history, or another kind, refuses it; nothing leaks.
      for (KvHistory other : {KvHistory::kSame, KvHistory::kDrop,
                              tier.history == KvHistory::kInt4 ? KvHistory::kInt8 : KvHistory::kInt4}) {
        EngineOptions p = base_options();
        p.kv.tiers = KvTierOptions{32, other};
        auto e = make(p);
        EXPECT_EQ(adopt(*e, kv, cases[0].params).status().code(), ErrorCode::kInvalidArgument)
            << kv_history_name(other);
        expect_no_leaks(*e, "refused history");
      }
      if (tier.sparse_budget == 0) {
        // Key bounds are needed where the importer attends sparsely: an export without them is refused.
        EngineOptions p = o;
        p.sparse_budget = 32;
        auto e = make(p);
        EXPECT_EQ(adopt(*e, kv, cases[0].params).status().code(), ErrorCode::kInvalidArgument);
        expect_no_leaks(*e, "no key bounds");
      }
    }
  }
}

TEST_F(DisaggTest, SeededSamplingOverTcpEqualsColocated) {
  const DisaggResult r = run_over_tcp(seeded_, base_options(), base_options());
  expect_same(r.outcomes, seeded_colocated(), "seeded");
  EXPECT_GE(r.num_transferred, 28);
}

// K/V left in an arena's memory (what --kv-transport cuda-ipc does with GPU memory), named by a
// region message and read by the decode side through its own mapping: here host memory, and a
// "mapping" that finds the same bytes by handle, in one process. Outputs equal colocated ones;
// a full arena sends the rest as host layers; every region comes back.
TEST_F(DisaggTest, KvInArenaRegionsEqualsColocated) {
  for (size_t arena_bytes : {size_t{64} << 20, size_t{96} << 10}) {
    SCOPED_TRACE(arena_bytes);
    std::vector<uint8_t> memory(arena_bytes);
    const std::vector<uint8_t> handle = {'t', 'e', 's', 't', 1, 2, 3, 4};
    bool released = false;
    {
      auto arena = std::make_shared<KvStagingPool>(Device::cpu(), memory.data(), memory.size(), handle,
                                                   [&released] { released = true; });
      int mapped = 0;
      const auto map_region = [&](std::span<const uint8_t> h, uint64_t offset, uint64_t bytes) -> Result<KvDeviceRegion> {
        if (!std::equal(h.begin(), h.end(), handle.begin(), handle.end()) || offset + bytes > memory.size()) {
          return make_error(ErrorCode::kInvalidArgument, "no such region");
        }
        ++mapped;
        KvDeviceRegion r;
        r.data = memory.data() + offset;
        r.device = Device::cpu();
        r.bytes = static_cast<size_t>(bytes);
        r.offset = offset;
        return r;
      };
      auto prefill = make(base_options());
      auto decode = make(base_options());
      TcpPair tcp = connect_pair();
      ASSERT_TRUE(prefill && decode && tcp.prefill_end);
      const DisaggResult r =
          run_disaggregated(greedy_, *prefill, *decode, *tcp.prefill_end, *tcp.decode_end, arena.get(), map_region);
      expect_same(r.outcomes, greedy_colocated(), "arena");
      EXPECT_GE(r.num_transferred, 28);
      EXPECT_EQ(mapped, r.num_in_regions);
      if (arena_bytes > (size_t{1} << 20)) {
        EXPECT_EQ(r.num_in_regions, r.num_transferred);  // all fit
      } else {
        EXPECT_GT(r.num_in_regions, 0);                   // some fit, the rest went as host layers
        EXPECT_LT(r.num_in_regions, r.num_transferred);
      }
      EXPECT_EQ(r.decode.prompt_tokens_computed, 0);
      EXPECT_EQ(arena->free_bytes(), arena->size()) << "every region came back";
      EXPECT_FALSE(released);
    }
    EXPECT_TRUE(released) << "the arena's memory goes with the arena";
  }
}

// A receiver that cannot map device memory refuses such a transfer with a clear error.
TEST_F(DisaggTest, RegionTransferToAReceiverThatCannotMapIsUnsupported) {
  std::vector<uint8_t> memory(size_t{8} << 20);
  KvStagingPool arena(Device::cpu(), memory.data(), memory.size(), {1, 2, 3}, nullptr);
  auto prefill = make(base_options());
  GenerationParams p = greedy_[7].params;
  p.prefill_only = true;
  ASSERT_TRUE(prefill->add_request(greedy_[7].prompt, p).ok());
  std::optional<KvExport> kv;
  while (prefill->has_unfinished()) {
    auto step = prefill->step();
    ASSERT_TRUE(step.ok());
    for (const RequestOutput& o : *step) {
      if (o.finish_reason == FinishReason::kTransfer) kv = std::move(export_kv(*prefill, o.id, &arena)).value();
    }
  }
  ASSERT_TRUE(kv && kv->device);
  EXPECT_TRUE(kv->layers.empty());
  EXPECT_LT(arena.free_bytes(), arena.size());
  auto [send_end, receive_end] = make_local_transport_pair();
  ASSERT_TRUE(send_kv(*send_end, *kv, 42, Millis(1000)).ok());
  KvReceiveOptions o;
  o.wait_timeout = Millis(1000);
  auto r = receive_kv(*receive_end, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(r.status().message().find("--kv-transport tcp"), std::string::npos) << r.status().to_string();
  kv.reset();
  EXPECT_EQ(arena.free_bytes(), arena.size());
  expect_no_leaks(*prefill, "prefill");
}

TEST_F(DisaggTest, LargerBlocksOnThePrefillSideAndASmallDecodeCache) {
  // Prefill: blocks of 32 in a cache just large enough; decode: blocks of 8, a cache of just the
  // context's 512 tokens, no prefix caching.
  EngineOptions prefill = base_options();
  prefill.kv.block_size = 32;
  prefill.kv.num_blocks = 512 / 32 + 4;
  prefill.scheduler.max_batched_tokens = 160;
  EngineOptions decode = base_options();
  decode.kv.block_size = 8;
  decode.kv.num_blocks = 512 / 8;
  decode.kv.prefix_caching = false;
  const std::vector<Case> cases = odd_cases(greedy_);
  const DisaggResult r = run_over_tcp(cases, prefill, decode);
  expect_same(r.outcomes, run_colocated(cases), "block sizes 32 -> 8");
  EXPECT_EQ(r.decode.prefix.hit_tokens, 0);
}

TEST_F(DisaggTest, SmallerBlocksOnThePrefillSideAndAFullDecodeSide) {
  // Blocks of 8 -> 16, over the in-process transport; the decode side runs at most three
  // sequences in a small cache, so adoptions wait for room.
  EngineOptions prefill = base_options();
  prefill.kv.block_size = 8;
  prefill.kv.num_blocks = 200;
  EngineOptions decode = base_options();
  decode.kv.block_size = 16;
  decode.kv.num_blocks = 512 / 16;
  decode.scheduler.max_seqs = 3;
  auto p = make(prefill);
  auto d = make(decode);
  auto [send_end, receive_end] = make_local_transport_pair();
  const std::vector<Case> cases = odd_cases(greedy_);
  const DisaggResult local = run_disaggregated(cases, *p, *d, *send_end, *receive_end);
  expect_same(local.outcomes, run_colocated(cases), "block sizes 8 -> 16, local transport");
  EXPECT_GT(local.num_adopt_retries, 0);
}

TEST_F(DisaggTest, StopStringsAcrossTheHandoverEqualColocated) {
  // A stop string that starts in the first token's text (the prefill side's) and ends in the
  // second's (the decode side's): the decode side must rebuild the held-back text to see it.
  const std::vector<Case> candidates(greedy_.begin(), greedy_.begin() + 10);
  const std::vector<Outcome> plain = run_colocated(candidates);
  std::vector<Case> cases;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Outcome& full = plain[i];
    if (full.tokens.size() < 3 || full.first_text.empty() || full.text.size() <= full.first_text.size()) continue;
    Case c = candidates[i];
    c.params.stop = {full.text.substr(full.first_text.size() - 1, 2)};
    cases.push_back(c);
  }
  ASSERT_GE(cases.size(), 4u);
  const std::vector<Outcome> colocated = run_colocated(cases);
  int stopped = 0;
  for (const Outcome& o : colocated) stopped += o.reason == FinishReason::kStop;
  EXPECT_GE(stopped, 4);
  auto prefill = make(base_options());
  auto decode = make(base_options());
  auto [send_end, receive_end] = make_local_transport_pair();
  const DisaggResult r = run_disaggregated(cases, *prefill, *decode, *send_end, *receive_end);
  expect_same(r.outcomes, colocated, "stop strings");
}

TEST_F(DisaggTest, CorruptedPayloadIsAChecksumErrorAndNothingLeaks) {
  const Case& c = greedy_[21];
  ASSERT_GT(c.prompt.size(), 16u);
  const KvExport kv = export_one(c);
  auto decode = make(base_options());
  // Message 0 is the header; 3 is layer 2's K/V; one bit flipped in each in turn.
  for (int message : {0, 3}) {
    TcpPair tcp = connect_pair();
    ASSERT_TRUE(tcp.prefill_end);
    CorruptingTransport corrupting(*tcp.prefill_end, message, message == 0 ? 100 : 1000);
    std::thread sender([&] { EXPECT_TRUE(send_kv(corrupting, kv, 77, Millis(5000)).ok()); });
    KvReceiveOptions o;
    o.expect = kv_model_shape(*decode);
    const auto r = receive_kv(*tcp.decode_end, o);
    sender.join();
    ASSERT_FALSE(r.ok()) << "message " << message;
    EXPECT_EQ(r.status().code(), ErrorCode::kCorruptFile) << r.status().to_string();
    EXPECT_NE(r.status().message().find("checksum"), std::string::npos) << r.status().message();
    if (message == 3) {
      EXPECT_NE(r.status().message().find("layer 2"), std::string::npos) << r.status().message();
    }
    // The decode side answers with the error; the prefill side hears it.
    ASSERT_TRUE(send_kv_ack(*tcp.decode_end, 77, r.status(), Millis(1000)).ok());
    const Status ack = receive_kv_ack(*tcp.prefill_end, 77, Millis(1000));
    EXPECT_EQ(ack.code(), ErrorCode::kCorruptFile) << ack.to_string();
  }
  expect_no_leaks(*decode, "decode after corrupt transfers");
  // The same bytes, uncorrupted, are adopted and continue exactly as colocated.
  auto [a, b] = make_local_transport_pair();
  ASSERT_TRUE(send_kv(*a, kv, 77, Millis(1000)).ok());
  auto r = receive_kv(*b, KvReceiveOptions{});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto id = adopt(*decode, r->kv, c.params);
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  ASSERT_TRUE(send_kv_ack(*b, 77, Status::Ok(), Millis(1000)).ok());
  EXPECT_TRUE(receive_kv_ack(*a, 77, Millis(1000)).ok());
  Outcome out;
  out.tokens = {kv.tokens.back()};
  while (decode->has_unfinished()) {
    auto step = decode->step();
    ASSERT_TRUE(step.ok());
    for (const RequestOutput& o : *step) collect(o, out);
  }
  EXPECT_EQ(out.tokens, greedy_colocated()[21].tokens);
  expect_no_leaks(*decode, "decode after the good transfer");
}

TEST_F(DisaggTest, PeerClosingMidTransferIsACleanErrorOnBothSides) {
  const Case& c = greedy_[13];
  // Decode side: the prefill worker sends the header and two layers, then goes away.
  {
    const KvExport kv = export_one(c);
    TcpPair tcp = connect_pair();
    ASSERT_TRUE(tcp.prefill_end);
    auto header = encode_kv_header(kv, 5);
    ASSERT_TRUE(header.ok());
    ASSERT_TRUE(tcp.prefill_end->send(*header, Millis(1000)).ok());
    ASSERT_TRUE(tcp.prefill_end->send(kv.layers[0], Millis(1000)).ok());
    ASSERT_TRUE(tcp.prefill_end->send(kv.layers[1], Millis(1000)).ok());
    tcp.prefill_end->close();
    auto decode = make(base_options());
    KvReceiveOptions o;
    o.timeout = Millis(3000);
    o.expect = kv_model_shape(*decode);
    const auto r = receive_kv(*tcp.decode_end, o);
    EXPECT_EQ(r.status().code(), ErrorCode::kIo) << r.status().to_string();
    EXPECT_NE(r.status().message().find("layer 2"), std::string::npos) << r.status().message();
    // It ended because the peer closed, not at the timeout.
    EXPECT_NE(r.status().message().find("closed"), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find("timed out"), std::string::npos) << r.status().message();
    expect_no_leaks(*decode, "decode side");
  }
  // Prefill side: the decode worker reads the header, then goes away; the sender hears of it
  // within its timeout, and its blocks were freed by the export already.
  {
    auto prefill = make(base_options());
    GenerationParams p = c.params;
    p.prefill_only = true;
    auto id = prefill->add_request(c.prompt, p);
    ASSERT_TRUE(id.ok());
    while (prefill->has_unfinished()) ASSERT_TRUE(prefill->step().ok());
    EXPECT_GT(prefill->stats().kv_blocks_used, 0);  // held for the transfer
    auto kv = export_kv(*prefill, *id);
    ASSERT_TRUE(kv.ok()) << kv.status().to_string();
    expect_no_leaks(*prefill, "prefill side after export");
    TcpPair tcp = connect_pair();
    ASSERT_TRUE(tcp.prefill_end);
    std::thread decode_worker([&] {
      auto header = tcp.decode_end->receive(1 << 20, Millis(2000));
      EXPECT_TRUE(header.ok());
      tcp.decode_end->close();
    });
    Status st = send_kv(*tcp.prefill_end, *kv, 6, Millis(2000));
    if (st.ok()) st = receive_kv_ack(*tcp.prefill_end, 6, Millis(2000));  // the layers fit the socket buffers
    decode_worker.join();
    EXPECT_EQ(st.code(), ErrorCode::kIo) << st.to_string();
    // The sender heard of the close, not of its timeout.
    EXPECT_EQ(st.message().find("timed out"), std::string::npos) << st.message();
    expect_no_leaks(*prefill, "prefill side after the failed transfer");
  }
  // A held request that is never exported: abort() frees its blocks, and export_kv() then fails.
  {
    auto prefill = make(base_options());
    GenerationParams p = c.params;
    p.prefill_only = true;
    auto id = prefill->add_request(c.prompt, p);
    ASSERT_TRUE(id.ok());
    while (prefill->has_unfinished()) ASSERT_TRUE(prefill->step().ok());
    EXPECT_TRUE(prefill->check_no_leaks().ok());
    EXPECT_GT(prefill->stats().kv_blocks_used, 0);
    EXPECT_TRUE(prefill->abort(*id));
    expect_no_leaks(*prefill, "after abort of a held request");
    EXPECT_EQ(export_kv(*prefill, *id).status().code(), ErrorCode::kNotFound);
    EXPECT_FALSE(prefill->abort(*id));
  }
}

TEST_F(DisaggTest, ModelShapeMismatchIsInvalidArgument) {
  const KvExport kv = export_one(greedy_[5]);
  // Another model (the bundled draft: 7 layers x 2 kv heads x head_dim 32).
  LoadOptions lo;
  lo.path = testing::source_dir() + "/models/tachyon-demo-draft";
  auto draft = load_model(lo);
  ASSERT_TRUE(draft.ok()) << draft.status().to_string();
  auto other = make(base_options(), *draft);
  auto id = adopt(*other, kv, greedy_[5].params);
  EXPECT_EQ(id.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("layers"), std::string::npos) << id.status().message();
  expect_no_leaks(*other, "other model");
  // Over the wire, the receiver refuses it from the header alone.
  TcpPair tcp = connect_pair();
  ASSERT_TRUE(tcp.prefill_end);
  std::thread sender([&] { (void)send_kv(*tcp.prefill_end, kv, 8, Millis(2000)); });
  KvReceiveOptions o;
  o.expect = kv_model_shape(*other);
  const auto r = receive_kv(*tcp.decode_end, o);
  tcp.decode_end->close();
  sender.join();
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << r.status().to_string();
  // The same model with a cache of another dtype.
  EngineOptions f16 = base_options();
  f16.kv.dtype = DType::kF16;
  auto half = make(f16);
  EXPECT_EQ(adopt(*half, kv, greedy_[5].params).status().code(), ErrorCode::kInvalidArgument);
  expect_no_leaks(*half, "f16 cache");
}

TEST_F(DisaggTest, BadImportsAreRejectedWithoutLeaks) {
  const Case& c = seeded_[11];
  const KvExport kv = export_one(c);
  ASSERT_EQ(kv.tokens.size(), c.prompt.size() + 1);
  EXPECT_EQ(kv.num_computed, static_cast<int>(c.prompt.size()));
  EXPECT_EQ(kv.sampler_seed, *c.params.sampling.seed);
  EXPECT_EQ(kv.rng_draws, 1u);
  auto decode = make(base_options());
  const auto rejected = [&](KvExport bad, GenerationParams p, ErrorCode code, const char* what) {
    auto id = adopt(*decode, bad, p);
    EXPECT_EQ(id.status().code(), code) << what << ": " << id.status().to_string();
    expect_no_leaks(*decode, what);
  };
  KvExport bad = kv;
  bad.layers[3].resize(bad.layers[3].size() - 4);
  rejected(bad, c.params, ErrorCode::kInvalidArgument, "short layer");
  bad = kv;
  bad.layers.pop_back();
  rejected(bad, c.params, ErrorCode::kInvalidArgument, "missing layer");
  bad = kv;
  bad.num_computed -= 1;
  rejected(bad, c.params, ErrorCode::kInvalidArgument, "computed count");
  bad = kv;
  bad.tokens.back() = 1 << 20;
  rejected(bad, c.params, ErrorCode::kInvalidArgument, "token outside the vocabulary");
  bad = kv;
  bad.num_prompt_tokens = static_cast<int>(bad.tokens.size());
  rejected(bad, c.params, ErrorCode::kInvalidArgument, "no generated token");
  bad = kv;
  bad.rng_draws = 5;
  rejected(bad, c.params, ErrorCode::kInvalidArgument, "random draws");
  GenerationParams p = c.params;
  p.sampling.seed = 1;
  rejected(kv, p, ErrorCode::kInvalidArgument, "another seed");
  p = c.params;
  p.prefill_only = true;
  rejected(kv, p, ErrorCode::kInvalidArgument, "prefill-only adoption");
  p = c.params;
  p.max_tokens = 1;
  rejected(kv, p, ErrorCode::kInvalidArgument, "max_tokens already reached");
  EngineOptions small = base_options();
  small.max_model_len = static_cast<int>(kv.tokens.size());
  small.kv.num_blocks = 64;
  auto short_context = make(small);
  EXPECT_EQ(adopt(*short_context, kv, c.params).status().code(), ErrorCode::kOutOfRange);
  expect_no_leaks(*short_context, "context too short");
  // Without a seed in the params, the exported stream's seed is used.
  p = c.params;
  p.sampling.seed.reset();
  auto id = adopt(*decode, kv, p);
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  Outcome out;
  out.tokens = {kv.tokens.back()};
  while (decode->has_unfinished()) {
    auto step = decode->step();
    ASSERT_TRUE(step.ok());
    for (const RequestOutput& o : *step) collect(o, out);
  }
  EXPECT_EQ(out.tokens, seeded_colocated()[11].tokens);
  expect_no_leaks(*decode, "after the good import");
}

TEST_F(DisaggTest, RequestsThatEndAtTheFirstTokenAreNotHeld) {
  auto prefill = make(base_options());
  GenerationParams p = greedy_[3].params;
  p.prefill_only = true;
  p.max_tokens = 1;
  auto id = prefill->add_request(greedy_[3].prompt, p);
  ASSERT_TRUE(id.ok());
  std::vector<RequestOutput> outs;
  while (prefill->has_unfinished()) {
    auto step = prefill->step();
    ASSERT_TRUE(step.ok());
    outs.insert(outs.end(), step->begin(), step->end());
  }
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].finish_reason, FinishReason::kLength);
  EXPECT_EQ(prefill->stats().num_transferring, 0);
  EXPECT_EQ(export_kv(*prefill, *id).status().code(), ErrorCode::kNotFound);
  expect_no_leaks(*prefill, "max_tokens 1");
}

}  // namespace
}  // namespace tachyon::disagg
