#include "disagg/kv_transfer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

#include <fmt/format.h>

#include "ops/ops.h"

namespace tachyon::disagg {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kHeaderFixedBytes = 84;  // up to and including rng_draws
constexpr size_t kAckFixedBytes = 24;     // up to and including the message length
constexpr size_t kMaxAckMessage = 4096;
constexpr size_t kRegionFixedBytes = 36;  // up to and including the handle's length
constexpr size_t kMaxRegionHandle = 256;

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) != 0 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// The format's dtype codes; 0 for a dtype it cannot carry.
uint32_t dtype_code(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 1;
    case DType::kF16: return 2;
    case DType::kBF16: return 3;
    case DType::kI8: return 4;
    case DType::kF8E4M3: return 5;
    default: return 0;
  }
}

std::optional<DType> dtype_of_code(uint32_t code) {
  switch (code) {
    case 1: return DType::kF32;
    case 2: return DType::kF16;
    case 3: return DType::kBF16;
    case 4: return DType::kI8;
    case 5: return DType::kF8E4M3;
    default: return std::nullopt;
  }
}

class Writer {
 public:
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void bytes(std::span<const uint8_t> b) { out_.insert(out_.end(), b.begin(), b.end()); }
  std::vector<uint8_t>& out() { return out_; }

 private:
  void put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t> out_;
};

// Reads from a message whose length the caller checked beforehand.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  uint16_t u16() { return static_cast<uint16_t>(get(2)); }
  uint32_t u32() { return static_cast<uint32_t>(get(4)); }
  uint64_t u64() { return get(8); }
  std::span<const uint8_t> bytes(size_t n) {
    TACHYON_CHECK(pos_ + n <= in_.size(), "wire read of {} bytes at {} of {}", n, pos_, in_.size());
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  size_t position() const { return pos_; }

 private:
  uint64_t get(int n) {
    TACHYON_CHECK(pos_ + static_cast<size_t>(n) <= in_.size(), "wire read of {} bytes at {} of {}", n, pos_,
                  in_.size());
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(in_[pos_ + static_cast<size_t>(i)]) << (8 * i);
    pos_ += static_cast<size_t>(n);
    return v;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

Millis remaining(Clock::time_point deadline) {
  return std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - Clock::now()));
}

// Bytes of one layer (K and V, and a quantized dtype's scales) of `num_positions` positions, or
// nullopt past 2^64.
// a * b * c, or nullopt past 2^64.
std::optional<uint64_t> product(uint64_t a, uint64_t b, uint64_t c) {
  const uint64_t limit = ~uint64_t{0};
  uint64_t n = a;
  for (uint64_t f : {b, c}) {
    if (f != 0 && n > limit / f) return std::nullopt;
    n *= f;
  }
  return n;
}

// KvExport::layer_bytes() from the header's fields, checked for overflow (head_dim < 2^17).
std::optional<uint64_t> layer_bytes_for(uint64_t num_positions, uint64_t heads, uint64_t head_dim, DType dtype,
                                        uint32_t history_bits, bool key_bounds, uint64_t history_positions,
                                        uint64_t block_size) {
  const std::optional<uint64_t> resident =
      product(2 * ops::kv_row_bytes(dtype, static_cast<int64_t>(head_dim)), num_positions, heads);
  if (!resident || history_bits == 0) return resident;
  const uint64_t row = (history_bits == 8 ? head_dim : head_dim / 2) + 4;
  const std::optional<uint64_t> rows = product(2 * row, history_positions, heads);
  const uint64_t per_block =
      head_dim + 8 * static_cast<uint64_t>(ops::key_bound_groups(static_cast<int64_t>(head_dim)));
  const std::optional<uint64_t> bounds =
      key_bounds ? product(per_block, history_positions / block_size, heads) : std::optional<uint64_t>(0);
  if (!rows || !bounds || *bounds > ~uint64_t{0} - *resident || *rows > ~uint64_t{0} - *resident - *bounds) {
    return std::nullopt;
  }
  return *resident + *rows + *bounds;
}

}  // namespace

uint32_t crc32c_reference(std::span<const uint8_t> bytes, uint32_t crc) {
  uint32_t c = ~crc;
  for (uint8_t b : bytes) c = kCrc32cTable[(c ^ b) & 0xffu] ^ (c >> 8);
  return ~c;
}

uint32_t crc32c(std::span<const uint8_t> bytes, uint32_t crc) {
#if defined(__SSE4_2__)
  uint64_t c = ~crc;
  const uint8_t* p = bytes.data();
  size_t n = bytes.size();
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
#else
  return crc32c_reference(bytes, crc);
#endif
}

std::string KvModelShape::to_string() const {
  return fmt::format("{} layers x {} kv heads x head_dim {}, {}, vocabulary {}", num_layers, num_kv_heads, head_dim,
                     dtype_name(dtype), vocab_size);
}

KvModelShape kv_model_shape(const KvExport& kv) {
  return {kv.num_layers, kv.num_kv_heads, kv.head_dim, kv.dtype, kv.vocab_size};
}

KvModelShape kv_model_shape(Engine& engine) {
  const KvCacheConfig& c = engine.kv_cache().config();
  return {c.num_layers, c.num_kv_heads, c.head_dim, c.dtype, engine.model().config().vocab_size};
}

Result<std::vector<uint8_t>> encode_kv_header(const KvExport& kv, uint64_t transfer_id) {
  const uint32_t code = dtype_code(kv.dtype);
  if (code == 0) return make_error(ErrorCode::kUnsupported, "kv transfer: no wire code for dtype {}", dtype_name(kv.dtype));
  if (kv.num_layers < 1 || kv.num_kv_heads < 1 || kv.head_dim < 1 || kv.vocab_size < 1 || kv.num_prompt_tokens < 0 ||
      kv.num_computed < 0 || static_cast<size_t>(kv.num_computed) > kv.tokens.size() || kv.first_position < 0 ||
      kv.first_position > kv.num_computed || kv.tokens.size() > UINT32_MAX ||
      (kv.history_bits != 0 && kv.history_bits != 8 && kv.history_bits != 4) ||
      (kv.history_bits != 0 && (kv.block_size < 1 || kv.first_position % kv.block_size != 0))) {
    return make_error(ErrorCode::kInvalidArgument,
                      "kv transfer: {} layers, {} kv heads, head_dim {}, vocabulary {}, {} tokens, {} prompt, {} computed",
                      kv.num_layers, kv.num_kv_heads, kv.head_dim, kv.vocab_size, kv.tokens.size(),
                      kv.num_prompt_tokens, kv.num_computed);
  }
  const size_t want = kv.layer_bytes();
  const size_t layers = static_cast<size_t>(kv.num_layers);
  if (kv.device) {
    if (!kv.layers.empty() || kv.device->bytes != kv.total_bytes() || kv.device->handle.empty() ||
        kv.device->handle.size() > kMaxRegionHandle) {
      return make_error(ErrorCode::kInvalidArgument,
                        "kv transfer: a device region of {} bytes (handle of {} bytes) and {} host layers for {} "
                        "layers of {} bytes",
                        kv.device->bytes, kv.device->handle.size(), kv.layers.size(), kv.num_layers, want);
    }
  } else {
    TACHYON_RETURN_IF_ERROR(kv.check_host_layers(kv.num_layers).with_context("kv transfer"));
  }
  Writer w;
  w.u32(kKvHeaderMagic);
  w.u16(kKvWireVersion);
  w.u16(kv.device ? kKvFlagDeviceRegion : 0);
  const size_t total = kHeaderFixedBytes + layers * 12 + kv.tokens.size() * 4 + 4;
  w.u32(static_cast<uint32_t>(total));
  for (int v : {kv.num_layers, kv.num_kv_heads, kv.head_dim}) w.u32(static_cast<uint32_t>(v));
  w.u32(code);
  for (int v : {kv.vocab_size, kv.block_size}) w.u32(static_cast<uint32_t>(v));
  w.u32(static_cast<uint32_t>(kv.tokens.size()));
  w.u32(static_cast<uint32_t>(kv.num_prompt_tokens));
  w.u32(static_cast<uint32_t>(kv.num_computed));
  w.u32(static_cast<uint32_t>(kv.first_position));
  w.u32(static_cast<uint32_t>(kv.history_bits));
  w.u32(kv.history_bits != 0 && kv.key_bounds ? 1u : 0u);
  w.u64(transfer_id);
  w.u64(kv.sampler_seed);
  w.u64(kv.rng_draws);
  for (size_t l = 0; l < layers; ++l) w.u64(want);
  // Bytes in device memory have no checksum here (the host never sees them): 0.
  for (size_t l = 0; l < layers; ++l) w.u32(kv.device ? 0 : crc32c(kv.layers[l]));
  for (int32_t t : kv.tokens) w.u32(static_cast<uint32_t>(t));
  w.u32(crc32c(w.out()));
  TACHYON_CHECK(w.out().size() == total, "kv header of {} bytes, {} planned", w.out().size(), total);
  return std::move(w.out());
}

Result<KvHeader> decode_kv_header(std::span<const uint8_t> message, const KvWireLimits& limits) {
  if (message.size() < kHeaderFixedBytes + 4) {
    return make_error(ErrorCode::kCorruptFile, "kv transfer: a header of {} bytes, shorter than the {} of its fixed part",
                      message.size(), kHeaderFixedBytes + 4);
  }
  Reader r(message);
  const uint32_t magic = r.u32();
  if (magic != kKvHeaderMagic) {
    return make_error(ErrorCode::kCorruptFile, "kv transfer: bad magic 0x{:08x} (a kv header starts with 0x{:08x})",
                      magic, kKvHeaderMagic);
  }
  // Every version starts with magic, version, flags and length, and ends with the checksum: a
  // corrupt header is told from a newer one.
  const uint16_t version = r.u16();
  const uint16_t flags = r.u16();
  const uint32_t header_bytes = r.u32();
  if (header_bytes != message.size()) {
    return make_error(ErrorCode::kCorruptFile, "kv transfer: the header says {} bytes, the message has {}", header_bytes,
                      message.size());
  }
  const uint32_t stored_crc = Reader(message.subspan(message.size() - 4)).u32();
  const uint32_t crc = crc32c(message.first(message.size() - 4));
  if (crc != stored_crc) {
    return make_error(ErrorCode::kCorruptFile, "kv transfer: header checksum 0x{:08x}, computed 0x{:08x}", stored_crc,
                      crc);
  }
  if (version != kKvWireVersion) {
    return make_error(ErrorCode::kUnsupported, "kv transfer: wire version {}; this build speaks {}", version,
                      kKvWireVersion);
  }
  if ((flags & ~kKvFlagDeviceRegion) != 0) {
    return make_error(ErrorCode::kUnsupported, "kv transfer: header flags 0x{:04x}", flags);
  }
  const uint32_t num_layers = r.u32(), num_kv_heads = r.u32(), head_dim = r.u32(), code = r.u32();
  const uint32_t vocab_size = r.u32(), block_size = r.u32();
  const uint32_t num_tokens = r.u32(), num_prompt = r.u32(), num_computed = r.u32(), first_position = r.u32();
  const uint32_t history_bits = r.u32(), history_flags = r.u32();
  KvHeader h;
  h.device_region = (flags & kKvFlagDeviceRegion) != 0;
  h.transfer_id = r.u64();
  h.meta.sampler_seed = r.u64();
  h.meta.rng_draws = r.u64();
  const std::optional<DType> dtype = dtype_of_code(code);
  if (!dtype) return make_error(ErrorCode::kUnsupported, "kv transfer: unknown dtype code {}", code);
  if (num_layers < 1 || num_layers > static_cast<uint32_t>(limits.max_layers) || num_tokens < 1 ||
      num_tokens > static_cast<uint32_t>(limits.max_tokens) || num_kv_heads < 1 || num_kv_heads > (1u << 16) ||
      head_dim < 1 || head_dim > (1u << 16) || vocab_size < 1 || vocab_size > INT32_MAX || block_size > INT32_MAX ||
      num_prompt > num_tokens || num_computed > num_tokens || first_position > num_computed ||
      (history_bits != 0 && history_bits != 8 && history_bits != 4) || (history_flags & ~1u) != 0 ||
      (history_bits == 0 && history_flags != 0) ||
      (history_bits != 0 && (block_size < 1 || first_position % block_size != 0 || head_dim % 2 != 0))) {
    return make_error(ErrorCode::kCorruptFile,
                      "kv transfer: header announces {} layers (at most {}), {} kv heads, head_dim {}, vocabulary {}, "
                      "block size {}, {} tokens (at most {}), {} prompt, {} computed from position {}, history bits {} "
                      "flags {}",
                      num_layers, limits.max_layers, num_kv_heads, head_dim, vocab_size, block_size, num_tokens,
                      limits.max_tokens, num_prompt, num_computed, first_position, history_bits, history_flags);
  }
  const size_t want_size = kHeaderFixedBytes + size_t{num_layers} * 12 + size_t{num_tokens} * 4 + 4;
  if (message.size() != want_size) {
    return make_error(ErrorCode::kCorruptFile, "kv transfer: a header of {} bytes for {} layers and {} tokens ({} expected)",
                      message.size(), num_layers, num_tokens, want_size);
  }
  const uint32_t num_positions = num_computed - first_position;
  const std::optional<uint64_t> layer_bytes =
      layer_bytes_for(num_positions, num_kv_heads, head_dim, *dtype, history_bits, history_flags != 0,
                      history_bits != 0 ? first_position : 0, block_size);
  if (!layer_bytes || *layer_bytes > limits.max_layer_bytes ||
      *layer_bytes > limits.max_total_bytes / num_layers) {
    return make_error(ErrorCode::kCorruptFile,
                      "kv transfer: {} layers of {} positions x {} kv heads x head_dim {} exceed the limits ({} bytes per "
                      "layer, {} in all)",
                      num_layers, num_positions, num_kv_heads, head_dim, limits.max_layer_bytes, limits.max_total_bytes);
  }
  h.layer_bytes.resize(num_layers);
  h.layer_crc.resize(num_layers);
  for (uint64_t& b : h.layer_bytes) b = r.u64();
  for (uint32_t& c : h.layer_crc) c = r.u32();
  for (uint32_t l = 0; l < num_layers; ++l) {
    if (h.layer_bytes[l] != *layer_bytes) {
      return make_error(ErrorCode::kCorruptFile, "kv transfer: layer {} announced as {} bytes; {} positions take {}", l,
                        h.layer_bytes[l], num_positions, *layer_bytes);
    }
  }
  KvExport& m = h.meta;
  m.num_layers = static_cast<int>(num_layers);
  m.num_kv_heads = static_cast<int>(num_kv_heads);
  m.head_dim = static_cast<int>(head_dim);
  m.dtype = *dtype;
  m.vocab_size = static_cast<int>(vocab_size);
  m.block_size = static_cast<int>(block_size);
  m.num_prompt_tokens = static_cast<int>(num_prompt);
  m.num_computed = static_cast<int>(num_computed);
  m.first_position = static_cast<int>(first_position);
  m.history_bits = static_cast<int>(history_bits);
  m.key_bounds = history_flags != 0;
  m.tokens.resize(num_tokens);
  for (int32_t& t : m.tokens) t = static_cast<int32_t>(r.u32());
  TACHYON_CHECK(r.position() == message.size() - 4, "kv header read to {} of {}", r.position(), message.size());
  return h;
}

// The common head of the small checksummed messages (ack, region): u32 magic, u16 version, u16
// flags, u64 transfer id, then the message's own fields, and a crc32c of all before it at the end.
struct SmallMessage {
  Reader r;
  uint32_t magic = 0, crc = 0, stored_crc = 0;
  uint16_t version = 0;
  uint64_t id = 0;
  // Magic, version and checksum all as they must be.
  bool intact(uint32_t want_magic) const { return magic == want_magic && version == kKvWireVersion && crc == stored_crc; }
};

Result<SmallMessage> open_small_message(std::span<const uint8_t> m, size_t fixed_bytes, const char* what,
                                        uint64_t transfer_id) {
  if (m.size() < fixed_bytes + 4) {
    return make_error(ErrorCode::kCorruptFile, "kv transfer {}: {} of {} bytes", transfer_id, what, m.size());
  }
  SmallMessage out{Reader(m)};
  out.crc = crc32c(m.first(m.size() - 4));
  out.stored_crc = Reader(m.subspan(m.size() - 4)).u32();
  out.magic = out.r.u32();
  out.version = out.r.u16();
  out.r.u16();  // flags
  out.id = out.r.u64();
  return out;
}

std::vector<uint8_t> encode_kv_region(const KvDeviceRegion& region, uint64_t transfer_id) {
  Writer w;
  w.u32(kKvRegionMagic);
  w.u16(kKvWireVersion);
  w.u16(0);
  w.u64(transfer_id);
  w.u64(region.offset);
  w.u64(region.bytes);
  w.u32(static_cast<uint32_t>(region.handle.size()));
  w.bytes(region.handle);
  w.u32(crc32c(w.out()));
  return std::move(w.out());
}

Result<KvRegionMessage> decode_kv_region(std::span<const uint8_t> m, uint64_t transfer_id) {
  TACHYON_ASSIGN_OR_RETURN(SmallMessage h, open_small_message(m, kRegionFixedBytes, "a region message", transfer_id));
  KvRegionMessage out;
  out.offset = h.r.u64();
  out.bytes = h.r.u64();
  const uint32_t handle_bytes = h.r.u32();
  if (!h.intact(kKvRegionMagic) || handle_bytes > kMaxRegionHandle || handle_bytes != m.size() - kRegionFixedBytes - 4) {
    return make_error(ErrorCode::kCorruptFile,
                      "kv transfer {}: bad region message (magic 0x{:08x}, version {}, checksum 0x{:08x} vs 0x{:08x}, "
                      "{} handle bytes in {})",
                      transfer_id, h.magic, h.version, h.stored_crc, h.crc, handle_bytes, m.size());
  }
  if (h.id != transfer_id) {
    return make_error(ErrorCode::kCorruptFile, "kv transfer {}: the region message is for transfer {}", transfer_id, h.id);
  }
  const auto handle = h.r.bytes(handle_bytes);
  out.handle.assign(handle.begin(), handle.end());
  return out;
}

Status send_kv(KvTransport& transport, const KvExport& kv, uint64_t transfer_id, Millis timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  TACHYON_ASSIGN_OR_RETURN(std::vector<uint8_t> header, encode_kv_header(kv, transfer_id));
  TACHYON_RETURN_IF_ERROR(transport.send(header, remaining(deadline)).with_context("kv transfer: header"));
  if (kv.device) {
    return transport.send(encode_kv_region(*kv.device, transfer_id), remaining(deadline))
        .with_context("kv transfer: device region");
  }
  for (size_t l = 0; l < kv.layers.size(); ++l) {
    TACHYON_RETURN_IF_ERROR(
        transport.send(kv.layers[l], remaining(deadline)).with_context(fmt::format("kv transfer: layer {}", l)));
  }
  return Status::Ok();
}

Result<ReceivedKv> receive_kv(KvTransport& transport, const KvReceiveOptions& options) {
  const KvWireLimits& limits = options.limits;
  const size_t max_header = kHeaderFixedBytes + static_cast<size_t>(std::max(limits.max_layers, 0)) * 12 +
                            static_cast<size_t>(std::max(limits.max_tokens, 0)) * 4 + 4;
  auto header_message = transport.receive(max_header, options.wait_timeout);
  if (!header_message.ok()) return header_message.status().with_context("kv transfer: header");
  const Clock::time_point deadline = Clock::now() + options.timeout;
  TACHYON_ASSIGN_OR_RETURN(KvHeader header, decode_kv_header(*header_message, limits));
  if (options.expect && kv_model_shape(header.meta) != *options.expect) {
    return make_error(ErrorCode::kInvalidArgument, "kv transfer {}: the sender's model is {}; this one is {}",
                      header.transfer_id, kv_model_shape(header.meta).to_string(), options.expect->to_string());
  }
  ReceivedKv received;
  received.transfer_id = header.transfer_id;
  received.kv = std::move(header.meta);
  KvImport& kv = received.kv;
  if (header.device_region) {
    auto message = transport.receive(kRegionFixedBytes + kMaxRegionHandle + 4, remaining(deadline));
    if (!message.ok()) return message.status().with_context(fmt::format("kv transfer {}: device region", header.transfer_id));
    TACHYON_ASSIGN_OR_RETURN(KvRegionMessage region, decode_kv_region(*message, header.transfer_id));
    const uint64_t want = header.layer_bytes.empty() ? 0 : header.layer_bytes[0] * header.layer_bytes.size();
    if (region.bytes != want) {
      return make_error(ErrorCode::kCorruptFile, "kv transfer {}: a device region of {} bytes; the header says {}",
                        header.transfer_id, region.bytes, want);
    }
    if (!options.map_region) {
      return make_error(ErrorCode::kUnsupported,
                        "kv transfer {}: the K/V are in the sender's device memory, which this worker cannot map (its "
                        "engine is not on a GPU of that host); run the prefill worker with --kv-transport tcp",
                        header.transfer_id);
    }
    auto mapped = options.map_region(region.handle, region.offset, region.bytes);
    if (!mapped.ok()) return mapped.status().with_context(fmt::format("kv transfer {}", header.transfer_id));
    kv.device = std::move(mapped).value();
    return received;
  }
  kv.layers.reserve(static_cast<size_t>(kv.num_layers));
  for (size_t l = 0; l < static_cast<size_t>(kv.num_layers); ++l) {
    const uint64_t want = header.layer_bytes[l];
    auto layer = transport.receive(static_cast<size_t>(want), remaining(deadline));
    if (!layer.ok()) return layer.status().with_context(fmt::format("kv transfer {}: layer {}", header.transfer_id, l));
    if (layer->size() != want) {
      return make_error(ErrorCode::kCorruptFile, "kv transfer {}: layer {} has {} bytes; the header says {}",
                        header.transfer_id, l, layer->size(), want);
    }
    const uint32_t crc = crc32c(*layer);
    if (crc != header.layer_crc[l]) {
      return make_error(ErrorCode::kCorruptFile, "kv transfer {}: layer {} checksum 0x{:08x}, the header says 0x{:08x}",
                        header.transfer_id, l, crc, header.layer_crc[l]);
    }
    kv.layers.push_back(std::move(layer).value());
  }
  return received;
}

Status send_kv_ack(KvTransport& transport, uint64_t transfer_id, const Status& outcome, Millis timeout) {
  const std::string& text = outcome.message();
  const size_t n = std::min(text.size(), kMaxAckMessage);
  Writer w;
  w.u32(kKvAckMagic);
  w.u16(kKvWireVersion);
  w.u16(0);
  w.u64(transfer_id);
  w.u32(static_cast<uint32_t>(outcome.code()));
  w.u32(static_cast<uint32_t>(n));
  w.bytes(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), n));
  w.u32(crc32c(w.out()));
  return transport.send(w.out(), timeout).with_context("kv transfer ack");
}

Status receive_kv_ack(KvTransport& transport, uint64_t transfer_id, Millis timeout) {
  auto message = transport.receive(kAckFixedBytes + kMaxAckMessage + 4, timeout);
  if (!message.ok()) return message.status().with_context(fmt::format("kv transfer {}: ack", transfer_id));
  const std::span<const uint8_t> m = *message;
  TACHYON_ASSIGN_OR_RETURN(SmallMessage h, open_small_message(m, kAckFixedBytes, "an ack", transfer_id));
  Reader& r = h.r;
  const uint32_t code = r.u32();
  const uint32_t length = r.u32();
  if (!h.intact(kKvAckMagic) || length != m.size() - kAckFixedBytes - 4) {
    return make_error(ErrorCode::kCorruptFile,
                      "kv transfer {}: bad ack (magic 0x{:08x}, version {}, checksum 0x{:08x} vs 0x{:08x}, {} message "
                      "bytes in {})",
                      transfer_id, h.magic, h.version, h.stored_crc, h.crc, length, m.size());
  }
  if (h.id != transfer_id) {
    return make_error(ErrorCode::kCorruptFile, "kv transfer {}: the ack is for transfer {}", transfer_id, h.id);
  }
  if (code == static_cast<uint32_t>(ErrorCode::kOk)) return Status::Ok();
  const auto bytes = r.bytes(length);
  const ErrorCode ec = code <= static_cast<uint32_t>(ErrorCode::kInternal) ? static_cast<ErrorCode>(code)
                                                                            : ErrorCode::kInternal;
  return Status(ec, "decode worker: " + std::string(bytes.begin(), bytes.end()));
}

}  // namespace tachyon::disagg
